"""In-memory state and write semantics of the fake Kubernetes API server.

This module is synchronous and HTTP-free: every mutation happens without an
``await``, so under trio it is atomic with respect to the HTTP handlers and
watch streams in :mod:`tests.fakes.apiserver`. See that module's docstring for
what is real and what is simplified.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime as _dt
import json
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
Path = tuple[str, ...]

_MISSING: Any = object()


# --------------------------------------------------------------------------------------
# Errors


class ApiError(Exception):
    """An error answered as a Kubernetes ``Status`` object."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details) if details else None
        self.headers = dict(headers) if headers else {}

    def status(self) -> Obj:
        return status_body(self.code, self.reason, self.message, self.details)


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def reason_for(code: int) -> str:
    return _REASONS.get(code, "Unknown")


def status_body(
    code: int, reason: str | None = None, message: str | None = None, details: Any = None
) -> Obj:
    """A ``Status`` object as the real API server sends it for a failure."""
    reason = reason or reason_for(code)
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message if message is not None else reason,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def not_found_resource() -> ApiError:
    return ApiError(
        404, "NotFound", "the server could not find the requested resource", details={}
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def too_large_resource_version(requested: int, current: int) -> ApiError:
    """What kube-apiserver answers for an RV newer than its own, once it has waited for it
    (``storage.NewTooLargeResourceVersionError``: a 504 ``Timeout`` whose cause type is
    ``ResourceVersionTooLarge``, retry after 1 s)."""
    return ApiError(
        504, "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        details={"causes": [{"reason": "ResourceVersionTooLarge",
                             "message": "Too large resource version"}],
                 "retryAfterSeconds": 1})


# --------------------------------------------------------------------------------------
# Resource table


@dataclass(frozen=True)
class ResourceType:
    """One API resource (a row of the server's discovery document)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    crd: bool = False
    has_generation: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """``deployments.apps`` / ``services``: how error messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


CRD_GROUP = "platform.trio-supervisor.dev"

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", False, has_generation=False,
                 singular="namespace", short_names=("ns",)),
    ResourceType("", "v1", "services", "Service", True, has_generation=False,
                 singular="service", short_names=("svc",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, has_generation=False,
                 singular="configmap", short_names=("cm",)),
    ResourceType("", "v1", "events", "Event", True, has_generation=False,
                 singular="event", short_names=("ev",)),
    ResourceType("apps", "v1", "deployments", "Deployment", True,
                 singular="deployment", short_names=("deploy",)),
    ResourceType("batch", "v1", "cronjobs", "CronJob", True,
                 singular="cronjob", short_names=("cj",)),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, has_generation=False,
                 singular="lease"),
    ResourceType(CRD_GROUP, "v1", "servicedefinitions", "ServiceDefinition", True, crd=True,
                 singular="servicedefinition", short_names=("sd",)),
    ResourceType(CRD_GROUP, "v1", "workflows", "Workflow", True, crd=True,
                 singular="workflow", short_names=("wf",)),
)


# --------------------------------------------------------------------------------------
# Selectors


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" match objects without the label, as the real server does
        return not present or value not in self.values


_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VAL = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\(\s*(?P<values>[^()]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VAL})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


def _split_top(selector: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_label_selector(selector: str | None) -> tuple[Requirement, ...]:
    """Parse ``k=v,k!=v,k,!k,k in (a,b),k notin (a,b)``; 400 on a malformed selector."""
    if not selector or not selector.strip():
        return ()
    reqs: list[Requirement] = []
    for raw in _split_top(selector):
        if not raw.strip():
            raise bad_request(f"unable to parse requirement: empty requirement in {selector!r}")
        if m := _SET_RE.match(raw):
            values = tuple(v.strip() for v in m["values"].split(",") if v.strip())
            if not values:
                raise bad_request(f"unable to parse requirement: {raw!r}: no values")
            reqs.append(Requirement(m["key"], m["op"], values))
            continue
        if m := _EQ_RE.match(raw):
            op = "!=" if m["op"] == "!=" else "="
            reqs.append(Requirement(m["key"], op, (m["value"],)))
            continue
        if m := _EXISTS_RE.match(raw):
            reqs.append(Requirement(m["key"], "!" if m["neg"] else "exists"))
            continue
        raise bad_request(f"unable to parse requirement: found {raw.strip()!r}")
    return tuple(reqs)


def labels_match(reqs: Iterable[Requirement], obj: Obj) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if not isinstance(labels, dict):
        labels = {}
    return all(r.matches(labels) for r in reqs)


_FIELDS = {"metadata.name": ("name",), "metadata.namespace": ("namespace",)}


def parse_field_selector(selector: str | None) -> tuple[tuple[str, str, str], ...]:
    """``metadata.name=x``, ``metadata.namespace!=y`` (comma-joined)."""
    if not selector or not selector.strip():
        return ()
    out = []
    for raw in selector.split(","):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", raw)
        if not m:
            raise bad_request(f"invalid field selector: {raw!r}")
        if m.group(1) not in _FIELDS:
            raise bad_request(f'field label not supported: {m.group(1)}')
        out.append((m.group(1), "!=" if m.group(2) == "!=" else "=", m.group(3)))
    return tuple(out)


def fields_match(reqs: Iterable[tuple[str, str, str]], obj: Obj) -> bool:
    md = obj.get("metadata") or {}
    for fld, op, value in reqs:
        actual = md.get(_FIELDS[fld][0], "") or ""
        if (actual == value) != (op == "="):
            return False
    return True


# --------------------------------------------------------------------------------------
# Patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"json patch: invalid pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict):
            if part not in doc:
                raise ApiError(422, "Invalid", f"json patch: path not found: {part}")
            doc = doc[part]
        elif isinstance(doc, list):
            try:
                doc = doc[int(part)]
            except (ValueError, IndexError) as exc:
                raise ApiError(422, "Invalid", f"json patch: bad index {part}") from exc
        else:
            raise ApiError(422, "Invalid", f"json patch: cannot traverse into {part}")
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    if not isinstance(ops, list):
        raise bad_request("json patch: body must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"json patch: malformed operation {op!r}")
        kind, parts = op["op"], _pointer(op["path"])
        if kind == "test":
            if _walk(doc, parts) != op.get("value"):
                raise ApiError(422, "Invalid", f"json patch: test failed at {op['path']}")
            continue
        if kind in ("move", "copy"):
            value = copy.deepcopy(_walk(doc, _pointer(op["from"])))
            if kind == "move":
                doc = _json_remove(doc, _pointer(op["from"]))
            doc = _json_add(doc, parts, value)
        elif kind == "add":
            doc = _json_add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _json_remove(doc, parts)
        elif kind == "replace":
            _walk(doc, parts)
            doc = _json_remove(doc, parts)
            doc = _json_add(doc, parts, copy.deepcopy(op.get("value")))
        else:
            raise bad_request(f"json patch: unknown op {kind!r}")
    return doc


def _json_add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                parent.insert(int(last), value)
            except ValueError as exc:
                raise ApiError(422, "Invalid", f"json patch: bad index {last}") from exc
    else:
        raise ApiError(422, "Invalid", "json patch: parent is not a container")
    return doc


def _json_remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return None
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    try:
        if isinstance(parent, dict):
            del parent[last]
        elif isinstance(parent, list):
            del parent[int(last)]
        else:
            raise ApiError(422, "Invalid", "json patch: parent is not a container")
    except (KeyError, ValueError, IndexError) as exc:
        raise ApiError(422, "Invalid", f"json patch: cannot remove {last}") from exc
    return doc


# --------------------------------------------------------------------------------------
# Field ownership (a simplified server-side apply)


@dataclass
class ManagerEntry:
    """The fields one manager owns through one operation on one subresource."""

    manager: str
    operation: str  # "Apply" | "Update"
    subresource: str  # "" | "status"
    api_version: str
    fields: set[Path]
    time: str


OwnerKey = tuple[str, str, str]  # (manager, operation, subresource)
Owners = dict[OwnerKey, ManagerEntry]

_USER_METADATA = ("labels", "annotations", "ownerReferences", "finalizers")
_SYSTEM_METADATA = (
    "name", "generateName", "namespace", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "managedFields",
)


def _flatten(value: Any, prefix: Path, out: dict[Path, Any], *, drop_none: bool) -> None:
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            if sub is None and drop_none:
                continue
            _flatten(sub, (*prefix, str(key)), out, drop_none=drop_none)
    else:
        out[prefix] = value


def scoped_leaves(obj: Obj, subresource: str, *, drop_none: bool = False) -> dict[Path, Any]:
    """The leaf fields of ``obj`` a manager can own on ``subresource`` ("" or "status").

    Maps are granular, lists are atomic (as for a CRD without list-type markers).
    """
    out: dict[Path, Any] = {}
    if subresource == "status":
        if isinstance(obj.get("status"), dict):
            _flatten(obj["status"], ("status",), out, drop_none=drop_none)
        return out
    for key, value in obj.items():
        if key in ("apiVersion", "kind", "status") or (value is None and drop_none):
            continue
        if key == "metadata":
            md = value if isinstance(value, dict) else {}
            for mkey in _USER_METADATA:
                if mkey in md and not (md[mkey] is None and drop_none):
                    _flatten(md[mkey], ("metadata", mkey), out, drop_none=drop_none)
            continue
        _flatten(value, (key,), out, drop_none=drop_none)
    return out


def _get_path(obj: Any, path: Path) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def _remove_path(obj: Obj, path: Path) -> None:
    parents: list[tuple[Obj, str]] = []
    node: Any = obj
    for part in path[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return
        parents.append((node, part))
        node = node[part]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    # prune maps emptied by the removal (keep top-level keys such as spec)
    for depth in range(len(parents) - 1, 0, -1):
        parent, key = parents[depth]
        if parent[key] == {}:
            del parent[key]
        else:
            break


def _deep_merge(target: Obj, config: Obj) -> None:
    for key, value in config.items():
        if value is None:
            continue
        if isinstance(value, dict) and value and isinstance(target.get(key), dict):
            _deep_merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def fields_v1(paths: Iterable[Path]) -> Obj:
    root: Obj = {}
    for path in sorted(paths):
        node = root
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return root


def render_managed_fields(owners: Owners) -> list[Obj]:
    out = []
    for entry in owners.values():
        item: Obj = {
            "manager": entry.manager,
            "operation": entry.operation,
            "apiVersion": entry.api_version,
            "time": entry.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1(entry.fields),
        }
        if entry.subresource:
            item["subresource"] = entry.subresource
        out.append(item)
    return out


def _copy_owners(owners: Owners) -> Owners:
    return {
        k: ManagerEntry(e.manager, e.operation, e.subresource, e.api_version, set(e.fields),
                        e.time)
        for k, e in owners.items()
    }


def _owner_sets(owners: Owners) -> dict[OwnerKey, frozenset[Path]]:
    return {k: frozenset(e.fields) for k, e in owners.items() if e.fields}


def update_ownership(
    owners: Owners, manager: str, subresource: str, api_version: str, old: Obj, new: Obj,
    now: str,
) -> Owners:
    """Ownership after an Update (create, PUT, merge/JSON patch) by ``manager``."""
    old_leaves = scoped_leaves(old, subresource)
    new_leaves = scoped_leaves(new, subresource)
    changed = {p for p, v in new_leaves.items() if old_leaves.get(p, _MISSING) != v}
    removed = set(old_leaves) - set(new_leaves)
    result = _copy_owners(owners)
    if not changed and not removed:
        return result
    key = (manager, "Update", subresource)
    for k, entry in result.items():
        if k[2] != subresource:
            continue
        entry.fields -= removed
        if k != key:
            entry.fields -= changed
    entry = result.setdefault(key, ManagerEntry(manager, "Update", subresource, api_version,
                                                set(), now))
    entry.fields |= changed
    entry.time = now
    return {k: e for k, e in result.items() if e.fields}


def apply_config(
    existing: Obj, owners: Owners, config: Obj, manager: str, subresource: str,
    api_version: str, force: bool, now: str, qualified: str, name: str,
) -> tuple[Obj, Owners]:
    """Server-side apply of ``config`` by ``manager``: the merged object and ownership.

    Raises a 409 Conflict (reason ``Conflict``, causes ``FieldManagerConflict``) when a
    field owned by another manager would change value and ``force`` is false.
    """
    config_leaves = scoped_leaves(config, subresource, drop_none=True)
    current = scoped_leaves(existing, subresource)
    key = (manager, "Apply", subresource)
    result = _copy_owners(owners)
    conflicts: dict[Path, set[str]] = {}
    for path, value in config_leaves.items():
        for k, entry in result.items():
            if k[0] == manager or k[2] != subresource:
                continue
            for owned in entry.fields:
                if owned == path:
                    clash = current.get(path, _MISSING) not in (_MISSING, value)
                elif owned[: len(path)] == path:  # we set a leaf over their subtree
                    clash = value != {}
                elif path[: len(owned)] == owned:  # we descend into their leaf
                    clash = not isinstance(_get_path(existing, owned), dict)
                else:
                    continue
                if clash:
                    conflicts.setdefault(owned, set()).add(entry.manager)
    if conflicts and not force:
        causes = [
            {
                "type": "FieldManagerConflict",
                "message": f'conflict with "{m}"',
                "field": "." + ".".join(p),
            }
            for p, managers in sorted(conflicts.items())
            for m in sorted(managers)
        ]
        lines = "\n".join(f"- {c['message']}: {c['field']}" for c in causes)
        raise ApiError(
            409,
            "Conflict",
            f"Apply failed with {len(causes)} conflict{'s' if len(causes) != 1 else ''}:\n"
            f"{lines}",
            details={"name": name, "group": qualified.partition(".")[2],
                     "kind": qualified.partition(".")[0], "causes": causes},
        )
    for k, entry in result.items():
        if k[0] != manager:
            entry.fields -= set(conflicts)
    previous = result[key].fields if key in result else set()
    others: set[Path] = set()
    for k, entry in result.items():
        if k != key and k[2] == subresource:
            others |= entry.fields
    merged = copy.deepcopy(existing)
    for path in sorted(previous - set(config_leaves), key=len, reverse=True):
        # keep it when the config now goes deeper, or another manager shares it
        if any(len(q) > len(path) and q[: len(path)] == path for q in config_leaves):
            continue
        if any(o[: len(path)] == path for o in others):
            continue
        _remove_path(merged, path)
    if subresource == "status":
        if "status" in config and isinstance(config["status"], dict):
            merged.setdefault("status", {})
            if not isinstance(merged["status"], dict):
                merged["status"] = {}
            _deep_merge(merged["status"], config["status"])
    else:
        scoped = {k: v for k, v in config.items() if k not in ("apiVersion", "kind", "status",
                                                                 "metadata")}
        _deep_merge(merged, scoped)
        cmd = config.get("metadata") or {}
        md = merged.setdefault("metadata", {})
        for mkey in _USER_METADATA:
            if mkey in cmd and cmd[mkey] is not None:
                if isinstance(cmd[mkey], dict) and isinstance(md.get(mkey), dict):
                    _deep_merge(md[mkey], cmd[mkey])
                else:
                    md[mkey] = copy.deepcopy(cmd[mkey])
    new_fields = set(config_leaves)
    old_entry = result.get(key)
    if new_fields:
        if old_entry is None or old_entry.fields != new_fields:
            result[key] = ManagerEntry(manager, "Apply", subresource, api_version, new_fields,
                                       now)
    else:
        result.pop(key, None)
    return merged, {k: e for k, e in result.items() if e.fields}


# --------------------------------------------------------------------------------------
# Defaulting and validation (a small, realistic subset)


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QNAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _check_name(res: ResourceType, name: str) -> str | None:
    if res.plural == "services":
        ok = len(name) <= 63 and bool(_DNS1035.match(name))
        kind = "a DNS-1035 label"
    elif res.plural == "namespaces":
        ok = len(name) <= 63 and bool(_DNS_LABEL.match(name))
        kind = "a lowercase RFC 1123 label"
    else:
        limit = 52 if res.plural == "cronjobs" else 253
        ok = len(name) <= limit and bool(_DNS_SUBDOMAIN.match(name))
        kind = "a lowercase RFC 1123 subdomain" + (" of at most 52 characters"
                                                     if limit == 52 else "")
    return None if ok else f'metadata.name: Invalid value: "{name}": must be {kind}'


def _check_labels(labels: Any, field_name: str, errors: list[tuple[str, str]]) -> None:
    if labels is None:
        return
    if not isinstance(labels, dict):
        errors.append((field_name, f"{field_name}: Invalid value: must be a map of strings"))
        return
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))) or not (
            len(name) <= 63 and _QNAME.match(name)
        ):
            errors.append((field_name, f'{field_name}: Invalid value: "{key}": '
                                       "name part must be a valid qualified name"))
        if field_name.endswith("labels"):
            if not isinstance(value, str) or len(value) > 63 or (value and not _QNAME.match(value)):
                errors.append((f"{field_name}", f'{field_name}: Invalid value: "{value}": a valid '
                                                "label must be an empty string or 63 characters "
                                                "or less of alphanumerics, '-', '_' or '.'"))
        elif not isinstance(value, str):
            errors.append((field_name, f"{field_name}: Invalid value: values must be strings"))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null"


def _check_selector_matches(selector: Any, labels: Any) -> bool:
    if not isinstance(selector, dict):
        return False
    labels = labels if isinstance(labels, dict) else {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(
            expr.get("operator"), "in")
        if not Requirement(expr.get("key", ""), op, tuple(expr.get("values") or ())).matches(
                labels):
            return False
    return True


def _check_pod_template(tmpl: Any, prefix: str, errors: list[tuple[str, str]],
                        job: bool = False) -> None:
    if not isinstance(tmpl, dict):
        errors.append((prefix, f"{prefix}: Required value"))
        return
    _check_labels((tmpl.get("metadata") or {}).get("labels"), f"{prefix}.metadata.labels",
                  errors)
    spec = tmpl.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or not containers:
        errors.append((f"{prefix}.spec.containers", f"{prefix}.spec.containers: Required value"))
    else:
        for i, c in enumerate(containers):
            cp = f"{prefix}.spec.containers[{i}]"
            if not isinstance(c, dict):
                errors.append((cp, f"{cp}: Invalid value: must be an object"))
                continue
            if not isinstance(c.get("name"), str) or not _DNS_LABEL.match(c.get("name") or ""):
                errors.append((f"{cp}.name", f"{cp}.name: Required value"))
            if not isinstance(c.get("image"), str) or not c.get("image"):
                errors.append((f"{cp}.image", f"{cp}.image: Required value"))
    if job and isinstance(spec, dict):
        policy = spec.get("restartPolicy", "Always")
        if policy not in ("OnFailure", "Never"):
            errors.append((f"{prefix}.spec.restartPolicy",
                           f'{prefix}.spec.restartPolicy: Required value: valid values: '
                           f'"OnFailure", "Never"'))


def _validate_deployment(obj: Obj, old: Obj | None, errors: list[tuple[str, str]]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errors.append(("spec", "spec: Required value"))
        return
    if "replicas" in spec and (not _is_int(spec["replicas"]) or spec["replicas"] < 0):
        errors.append(("spec.replicas", f'spec.replicas: Invalid value: {spec["replicas"]!r}: '
                                        "must be greater than or equal to 0"))
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not (selector.get("matchLabels")
                                              or selector.get("matchExpressions")):
        errors.append(("spec.selector", "spec.selector: Required value"))
    else:
        tmpl_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
        if not _check_selector_matches(selector, tmpl_labels):
            errors.append(("spec.template.metadata.labels",
                           f"spec.template.metadata.labels: Invalid value: {tmpl_labels!r}: "
                           "`selector` does not match template `labels`"))
        if old is not None and (old.get("spec") or {}).get("selector") != selector:
            errors.append(("spec.selector", f"spec.selector: Invalid value: {selector!r}: "
                                            "field is immutable"))
    _check_pod_template(spec.get("template"), "spec.template", errors)


def _validate_service(obj: Obj, old: Obj | None, errors: list[tuple[str, str]]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errors.append(("spec", "spec: Required value"))
        return
    ports = spec.get("ports")
    if ports is not None and not isinstance(ports, list):
        errors.append(("spec.ports", "spec.ports: Invalid value: must be a list"))
        ports = []
    headless = spec.get("clusterIP") == "None"
    if spec.get("type", "ClusterIP") != "ExternalName" and not headless and not ports:
        errors.append(("spec.ports", "spec.ports: Required value"))
    for i, p in enumerate(ports or []):
        port = p.get("port") if isinstance(p, dict) else None
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            errors.append((f"spec.ports[{i}].port",
                           f"spec.ports[{i}].port: Invalid value: {port!r}: must be between 1 "
                           "and 65535, inclusive"))
    if ports and len(ports) > 1 and any(not (isinstance(p, dict) and p.get("name"))
                                        for p in ports):
        errors.append(("spec.ports", "spec.ports[0].name: Required value"))
    if old is not None:
        old_ip = (old.get("spec") or {}).get("clusterIP")
        new_ip = spec.get("clusterIP")
        if old_ip and new_ip and new_ip != old_ip:
            errors.append(("spec.clusterIP", f'spec.clusterIP: Invalid value: "{new_ip}": '
                                             "field is immutable"))


def _validate_cronjob(obj: Obj, old: Obj | None, errors: list[tuple[str, str]]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errors.append(("spec", "spec: Required value"))
        return
    schedule = spec.get("schedule")
    if not isinstance(schedule, str) or not schedule.strip():
        errors.append(("spec.schedule", "spec.schedule: Required value"))
    elif not schedule.startswith("@") and len(schedule.split()) != 5:
        errors.append(("spec.schedule", f'spec.schedule: Invalid value: "{schedule}": '
                                        f"expected exactly 5 fields, found "
                                        f"{len(schedule.split())}"))
    job_spec = (spec.get("jobTemplate") or {}).get("spec") if isinstance(
        spec.get("jobTemplate"), dict) else None
    if not isinstance(job_spec, dict):
        errors.append(("spec.jobTemplate", "spec.jobTemplate.spec: Required value"))
        return
    _check_pod_template(job_spec.get("template"), "spec.jobTemplate.spec.template", errors,
                        job=True)


# CRD schemas: spec field -> (type, required)
_CRD_SCHEMAS: dict[str, dict[str, tuple[str, bool]]] = {
    "servicedefinitions": {"image": ("string", True), "replicas": ("integer", False),
                           "port": ("integer", False), "env": ("map[string]string", False)},
    "workflows": {"image": ("string", True), "schedule": ("string", True),
                  "args": ("[]string", False)},
}


def _validate_crd(obj: Obj, plural: str, errors: list[tuple[str, str]]) -> None:
    schema = _CRD_SCHEMAS.get(plural)
    if schema is None:
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errors.append(("spec", "spec: Required value"))
        return
    for name, (typ, required) in schema.items():
        fld = f"spec.{name}"
        if name not in spec:
            if required:
                errors.append((fld, f"{fld}: Required value"))
            continue
        value = spec[name]
        ok = {
            "string": isinstance(value, str),
            "integer": _is_int(value),
            "map[string]string": isinstance(value, dict)
            and all(isinstance(v, str) for v in value.values()),
            "[]string": isinstance(value, list) and all(isinstance(v, str) for v in value),
        }[typ]
        if not ok:
            want = {"map[string]string": "object", "[]string": "array"}.get(typ, typ)
            errors.append((fld, f'{fld}: Invalid value: "{_type_name(value)}": {fld} in body '
                                f"must be of type {want}: {json.dumps(value)}"))
    if _is_int(spec.get("replicas")) and spec["replicas"] < 0:
        errors.append(("spec.replicas", "spec.replicas: Invalid value: "
                                        f"{spec['replicas']}: spec.replicas in body should be "
                                        "greater than or equal to 0"))
    if _is_int(spec.get("port")) and not 1 <= spec["port"] <= 65535:
        errors.append(("spec.port", f"spec.port: Invalid value: {spec['port']}: must be between "
                                    "1 and 65535"))


def validate(res: ResourceType, obj: Obj, old: Obj | None) -> None:
    """Raise 422 Invalid like the real server's validation (a subset of it)."""
    errors: list[tuple[str, str]] = []
    md = obj.get("metadata") or {}
    if msg := _check_name(res, str(md.get("name", ""))):
        errors.append(("metadata.name", msg))
    _check_labels(md.get("labels"), "metadata.labels", errors)
    _check_labels(md.get("annotations"), "metadata.annotations", errors)
    if res.crd:
        _validate_crd(obj, res.plural, errors)
    elif res.plural == "deployments":
        _validate_deployment(obj, old, errors)
    elif res.plural == "services":
        _validate_service(obj, old, errors)
    elif res.plural == "cronjobs":
        _validate_cronjob(obj, old, errors)
    if errors:
        name = md.get("name", "")
        what = f'{res.kind}{"." + res.group if res.group else ""} "{name}"'
        if len(errors) == 1:
            message = f"{what} is invalid: {errors[0][1]}"
        else:
            message = f"{what} is invalid: [{', '.join(m for _, m in errors)}]"
        raise ApiError(
            422,
            "Invalid",
            message,
            details={"name": name, "group": res.group, "kind": res.kind,
                     "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f}
                                for f, m in errors]},
        )


def _pull_policy(image: Any) -> str:
    if not isinstance(image, str) or "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _default_pod_template(tmpl: Any) -> None:
    """The pod-template defaults a real server adds (so reads differ from what was sent)."""
    if not isinstance(tmpl, dict) or not isinstance(tmpl.get("spec"), dict):
        return
    spec = tmpl["spec"]
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        container.setdefault("resources", {})
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", _pull_policy(container.get("image")))
        for port in container.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")


def apply_defaults(res: ResourceType, obj: Obj, old: Obj | None, alloc_ip: Callable[[], str],
                   ) -> None:
    """Fill the server-side defaults a client sees in its reads (a subset)."""
    spec = obj.get("spec")
    if res.plural == "namespaces":
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj["status"] = (old or {}).get("status") or {"phase": "Active"}
        md = obj.setdefault("metadata", {})
        md.setdefault("labels", {})["kubernetes.io/metadata.name"] = md.get("name", "")
        return
    if not isinstance(spec, dict):
        return
    if res.plural == "deployments":
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault("strategy", {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxSurge": "25%",
                                                       "maxUnavailable": "25%"}})
        _default_pod_template(spec.get("template"))
    elif res.plural == "services":
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec.get("type") in ("ClusterIP", "NodePort", "LoadBalancer"):
            old_ip = ((old or {}).get("spec") or {}).get("clusterIP")
            if not spec.get("clusterIP"):
                spec["clusterIP"] = old_ip or alloc_ip()
            if spec["clusterIP"] != "None":
                spec["clusterIPs"] = [spec["clusterIP"]]
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                if "port" in port:
                    port.setdefault("targetPort", port["port"])
    elif res.plural == "cronjobs":
        spec.setdefault("suspend", False)
        spec.setdefault("concurrencyPolicy", "Allow")
        spec.setdefault("successfulJobsHistoryLimit", 3)
        spec.setdefault("failedJobsHistoryLimit", 1)
        job = (spec.get("jobTemplate") or {}).get("spec") if isinstance(
            spec.get("jobTemplate"), dict) else None
        if isinstance(job, dict):
            job.setdefault("backoffLimit", 6)
            job.setdefault("completions", 1)
            job.setdefault("parallelism", 1)
            job.setdefault("completionMode", "NonIndexed")
            job.setdefault("suspend", False)
            _default_pod_template(job.get("template"))
    elif res.plural == "servicedefinitions":
        spec.setdefault("replicas", 1)


# --------------------------------------------------------------------------------------
# The store


@dataclass
class WatchEvent:
    """One committed change, kept in the history window for watches."""

    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    plural: str
    namespace: str
    obj: Obj
    old: Obj | None


@dataclass
class WriteResult:
    obj: Obj
    changed: bool
    created: bool = False


def now_rfc3339() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _order(obj: Obj) -> Obj:
    head = ("apiVersion", "kind", "metadata", "spec")
    out = {k: obj[k] for k in head if k in obj}
    out.update({k: v for k, v in obj.items() if k not in head and k != "status"})
    if "status" in obj:
        out["status"] = obj["status"]
    return out


def _content(obj: Obj) -> Obj:
    """The object minus the fields a no-op write may legitimately differ in."""
    out = dict(obj)
    md = dict(out.get("metadata") or {})
    for k in ("resourceVersion", "managedFields", "generation"):
        md.pop(k, None)
    out["metadata"] = md
    return out


def _body_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Store:
    """Objects, resourceVersions, history and field ownership."""

    def __init__(
        self,
        resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
        *,
        crds_installed: bool = True,
        defaulting: bool = True,
        validation: bool = True,
        history_limit: int = 10_000,
    ) -> None:
        self.resources: dict[tuple[str, str, str], ResourceType] = {}
        self.by_kind: dict[tuple[str, str], ResourceType] = {}
        self.by_plural: dict[str, ResourceType] = {}
        self.installed: set[str] = set()
        for res in resources:
            self.register(res, installed=crds_installed or not res.crd)
        self.rv = 1
        self.floor = 0  # watches/continues from an RV below this get 410
        self.history: deque[WatchEvent] = deque()
        self.history_limit = history_limit
        self.defaulting = defaulting
        self.validation = validation
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {p: {} for p in self.by_plural}
        self.owners: dict[tuple[str, str, str], Owners] = {}
        self.listeners: list[Callable[[WatchEvent], None]] = []
        self._ip = 0

    # -- resource table -------------------------------------------------------------
    def register(self, res: ResourceType, *, installed: bool = True) -> None:
        self.resources[(res.group, res.version, res.plural)] = res
        self.by_kind[(res.api_version, res.kind)] = res
        self.by_plural[res.plural] = res
        if installed:
            self.installed.add(res.plural)
        if hasattr(self, "objects"):
            self.objects.setdefault(res.plural, {})

    def lookup(self, group: str, version: str, plural: str) -> ResourceType:
        res = self.resources.get((group, version, plural))
        if res is None or res.plural not in self.installed:
            raise not_found_resource()
        return res

    def resource(self, plural: str) -> ResourceType:
        res = self.by_plural.get(plural)
        if res is None:
            raise KeyError(f"unknown resource {plural!r}")
        return res

    def resource_of(self, obj: Obj) -> ResourceType:
        res = self.by_kind.get((str(obj.get("apiVersion", "")), str(obj.get("kind", ""))))
        if res is None:
            raise bad_request(
                f"no resource for apiVersion={obj.get('apiVersion')!r} kind={obj.get('kind')!r}")
        return res

    # -- helpers -------------------------------------------------------------------
    def _alloc_ip(self) -> str:
        self._ip += 1
        return f"10.96.{(self._ip >> 8) & 255}.{self._ip & 255}"

    def _not_found(self, res: ResourceType, name: str) -> ApiError:
        return ApiError(404, "NotFound", f'{res.qualified} "{name}" not found',
                        details={"name": name, "group": res.group, "kind": res.plural})

    def namespace_exists(self, ns: str) -> bool:
        return ("", ns) in self.objects["namespaces"]

    def _check_namespace(self, res: ResourceType, ns: str) -> None:
        if res.namespaced and not self.namespace_exists(ns):
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found',
                           details={"name": ns, "kind": "namespaces"})

    def _key(self, res: ResourceType, ns: str | None) -> str:
        return (ns or "") if res.namespaced else ""

    def get(self, res: ResourceType, ns: str | None, name: str) -> Obj:
        obj = self.objects[res.plural].get((self._key(res, ns), name))
        if obj is None:
            raise self._not_found(res, name)
        return obj

    def find(self, res: ResourceType, ns: str | None, name: str) -> Obj | None:
        return self.objects[res.plural].get((self._key(res, ns), name))

    def encode_continue(self, rv: int, start: tuple[str, str]) -> str:
        raw = json.dumps({"rv": rv, "start": list(start)}).encode()
        return base64.urlsafe_b64encode(raw).decode()

    def decode_continue(self, token: str) -> tuple[int, tuple[str, str]]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv, start = int(data["rv"]), (str(data["start"][0]), str(data["start"][1]))
        except (ValueError, KeyError, TypeError, IndexError, binascii.Error) as exc:
            raise bad_request(f"invalid continue token: {exc}") from exc
        if rv < self.floor:
            raise ApiError(
                410, "Expired",
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter, or use the "
                "continue token in this response to retrieve the remainder of the results.")
        return rv, start

    def list_objects(
        self,
        res: ResourceType,
        ns: str | None,
        *,
        labels: tuple[Requirement, ...] = (),
        fields: tuple[tuple[str, str, str], ...] = (),
        limit: int | None = None,
        cont: str | None = None,
    ) -> tuple[list[Obj], str, str | None, int | None]:
        """(items, list RV, continue token or None, remainingItemCount or None)."""
        rv = self.rv
        start: tuple[str, str] | None = None
        if cont:
            rv, start = self.decode_continue(cont)
        keys = sorted(self.objects[res.plural])
        items = []
        for key in keys:
            if ns is not None and res.namespaced and key[0] != ns:
                continue
            if start is not None and key <= start:
                continue
            obj = self.objects[res.plural][key]
            if labels_match(labels, obj) and fields_match(fields, obj):
                items.append((key, obj))
        token = None
        remaining = None
        if limit and limit > 0 and len(items) > limit:
            token = self.encode_continue(rv, items[limit - 1][0])
            remaining = len(items) - limit
            items = items[:limit]
        return [o for _, o in items], str(self.rv if not cont else rv), token, remaining

    # -- commit ---------------------------------------------------------------------
    def _commit(self, res: ResourceType, ns: str, name: str, obj: Obj | None, owners: Owners,
                event: str, old: Obj | None) -> Obj:
        self.rv += 1
        key = (self._key(res, ns), name)
        okey = (res.plural, key[0], name)
        if obj is None:  # deletion
            assert old is not None
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[res.plural].pop(key, None)
            self.owners.pop(okey, None)
            self._record(WatchEvent(self.rv, "DELETED", res.plural, key[0], gone, old))
            return gone
        obj = copy.deepcopy(obj)
        md = obj["metadata"]
        md["resourceVersion"] = str(self.rv)
        if owners:
            md["managedFields"] = render_managed_fields(owners)
        else:
            md.pop("managedFields", None)
        obj = _order(obj)
        self.objects[res.plural][key] = obj
        self.owners[okey] = owners
        self._record(WatchEvent(self.rv, event, res.plural, key[0], obj, old))
        return obj

    def _record(self, ev: WatchEvent) -> None:
        self.history.append(ev)
        while len(self.history) > self.history_limit:
            dropped = self.history.popleft()
            self.floor = max(self.floor, dropped.rv)
        for listener in list(self.listeners):
            listener(ev)

    def compact(self) -> int:
        """Forget the history: every RV handed out so far is now too old (watches from it
        and continue tokens get 410). The RV moves on by one, as if something unrelated was
        written, so a fresh list yields an RV that can be watched from."""
        self.rv += 1
        self.history.clear()
        self.floor = self.rv
        return self.rv

    def reset(self, *, keep_crds: bool = True) -> int:
        """Forget every object, its field ownership and the history, and restart the RV
        counter (an etcd restored from an empty backup); no watch event is sent. The CRDs
        stay installed unless ``keep_crds=False``. Returns the (new, lower) RV."""
        for plural in self.objects:
            self.objects[plural].clear()
        self.owners.clear()
        self.history.clear()
        self.rv = 1
        self.floor = 0
        self._ip = 0
        if not keep_crds:
            self.installed -= {res.plural for res in self.by_plural.values() if res.crd}
        return self.rv

    def history_since(self, rv: int) -> list[WatchEvent]:
        if rv < self.floor:
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.floor})")
        return [ev for ev in self.history if ev.rv > rv]

    def _finish(self, res: ResourceType, new: Obj, old: Obj | None) -> Obj:
        new = _order(new)
        if self.defaulting:
            apply_defaults(res, new, old, self._alloc_ip)
        if self.validation:
            validate(res, new, old)
        if res.has_generation:
            gen = int(((old or {}).get("metadata") or {}).get("generation") or 0)
            if old is None:
                gen = 1
            elif _body_part(new) != _body_part(old):
                gen += 1
            new["metadata"]["generation"] = gen
        return new

    def _owners_of(self, res: ResourceType, ns: str, name: str) -> Owners:
        return self.owners.get((res.plural, self._key(res, ns), name), {})

    @staticmethod
    def _precondition(res: ResourceType, existing: Obj, rv: Any, name: str) -> None:
        if rv not in (None, "") and str(rv) != existing["metadata"]["resourceVersion"]:
            raise ApiError(
                409, "Conflict",
                f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
                details={"name": name, "group": res.group, "kind": res.plural})

    def _skeleton(self, res: ResourceType, ns: str, name: str, body_md: Mapping[str, Any]) -> Obj:
        md: Obj = {"name": name}
        if res.namespaced:
            md["namespace"] = ns
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = now_rfc3339()
        for k in _USER_METADATA:
            if body_md.get(k) is not None:
                md[k] = copy.deepcopy(body_md[k])
        return {"apiVersion": res.api_version, "kind": res.kind, "metadata": md}

    def _check_body(self, res: ResourceType, body: Any, ns: str, name: str | None) -> Obj:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        if body.get("apiVersion") not in (None, "", res.api_version):
            raise bad_request(f"the API version in the data ({body['apiVersion']}) does not "
                              f"match the expected API version ({res.api_version})")
        if body.get("kind") not in (None, "", res.kind):
            raise bad_request(f"the kind in the data ({body['kind']}) does not match the "
                              f"expected kind ({res.kind})")
        md = body.get("metadata")
        if md is not None and not isinstance(md, dict):
            raise bad_request("metadata must be an object")
        md = md or {}
        if res.namespaced and md.get("namespace") not in (None, "", ns):
            raise bad_request("the namespace of the provided object does not match the "
                              "namespace sent on the request")
        if name is not None and md.get("name") not in (None, "", name):
            raise bad_request("the name of the object "
                              f"({md.get('name')}) does not match the name on the URL ({name})")
        return body

    # -- writes -------------------------------------------------------------------
    def create(self, res: ResourceType, ns: str, body: Any, manager: str,
               dry_run: bool = False) -> WriteResult:
        body = self._check_body(res, body, ns, None)
        md = body.get("metadata") or {}
        name = md.get("name") or ""
        if not name and md.get("generateName"):
            name = f"{md['generateName']}{uuid.uuid4().hex[:5]}"
        if not name:
            raise ApiError(422, "Invalid", f"{res.kind} is invalid: metadata.name: Required "
                           "value: name or generateName is required")
        self._check_namespace(res, ns)
        if self.find(res, ns, name) is not None:
            raise ApiError(409, "AlreadyExists", f'{res.qualified} "{name}" already exists',
                           details={"name": name, "group": res.group, "kind": res.plural})
        new = self._skeleton(res, ns, name, md)
        new.update({k: copy.deepcopy(v) for k, v in body.items()
                    if k not in ("apiVersion", "kind", "metadata", "status")})
        new = self._finish(res, new, None)
        now = now_rfc3339()
        owners = update_ownership({}, manager, "", res.api_version, {}, new, now)
        if dry_run:
            return WriteResult(new, False, True)
        return WriteResult(self._commit(res, ns, name, new, owners, "ADDED", None), True, True)

    def _write(self, res: ResourceType, ns: str, name: str, existing: Obj, new: Obj,
               owners: Owners, dry_run: bool) -> WriteResult:
        new = self._finish(res, new, existing)
        old_owners = self._owners_of(res, ns, name)
        if _content(new) == _content(existing) and _owner_sets(owners) == _owner_sets(
                old_owners):
            return WriteResult(existing, False)
        if dry_run:
            return WriteResult(new, False)
        return WriteResult(self._commit(res, ns, name, new, owners, "MODIFIED", existing), True)

    def _rebuild(self, res: ResourceType, existing: Obj, candidate: Obj, subresource: str) -> Obj:
        """Keep what a write to ``subresource`` may not change from ``existing``."""
        if subresource == "status":
            new = copy.deepcopy(existing)
            if isinstance(candidate.get("status"), dict):
                new["status"] = copy.deepcopy(candidate["status"])
            else:
                new.pop("status", None)
            return new
        new = {k: copy.deepcopy(v) for k, v in candidate.items()
               if k not in ("apiVersion", "kind", "metadata", "status")}
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        md = {k: copy.deepcopy(v) for k, v in existing["metadata"].items()
              if k in _SYSTEM_METADATA}
        cmd = candidate.get("metadata") or {}
        for k in _USER_METADATA:
            if cmd.get(k) is not None:
                md[k] = copy.deepcopy(cmd[k])
        new["metadata"] = md
        if "status" in existing:
            new["status"] = copy.deepcopy(existing["status"])
        return new

    def replace(self, res: ResourceType, ns: str, name: str, body: Any, manager: str,
                subresource: str = "", dry_run: bool = False) -> WriteResult:
        body = self._check_body(res, body, ns, name)
        existing = self.get(res, ns, name)
        md = body.get("metadata") or {}
        self._precondition(res, existing, md.get("resourceVersion"), name)
        if md.get("uid") not in (None, "", existing["metadata"]["uid"]):
            raise ApiError(409, "Conflict", f'Precondition failed: UID in precondition: '
                                            f'{md["uid"]}, UID in object meta: '
                                            f'{existing["metadata"]["uid"]}')
        new = self._rebuild(res, existing, body, subresource)
        owners = update_ownership(self._owners_of(res, ns, name), manager, subresource,
                                  res.api_version, existing, new, now_rfc3339())
        return self._write(res, ns, name, existing, new, owners, dry_run)

    def patch(self, res: ResourceType, ns: str, name: str, patch_type: str, body: Any,
              manager: str | None, subresource: str = "", force: bool = False,
              dry_run: bool = False) -> WriteResult:
        now = now_rfc3339()
        if patch_type == "apply":
            return self._apply(res, ns, name, body, manager, subresource, force, dry_run, now)
        existing = self.get(res, ns, name)
        if patch_type == "merge":
            if not isinstance(body, dict):
                raise bad_request("merge patch body must be a JSON object")
            self._precondition(res, existing, (body.get("metadata") or {}).get(
                "resourceVersion"), name)
            patched = merge_patch(existing, body)
        elif patch_type == "json":
            patched = json_patch(existing, body)
            if not isinstance(patched, dict):
                raise ApiError(422, "Invalid", "json patch produced a non-object")
            self._precondition(res, existing,
                               (patched.get("metadata") or {}).get("resourceVersion"), name)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {patch_type}")
        new = self._rebuild(res, existing, patched, subresource)
        owners = update_ownership(self._owners_of(res, ns, name), manager or "unknown",
                                  subresource, res.api_version, existing, new, now)
        return self._write(res, ns, name, existing, new, owners, dry_run)

    def _apply(self, res: ResourceType, ns: str, name: str, body: Any, manager: str | None,
               subresource: str, force: bool, dry_run: bool, now: str) -> WriteResult:
        if not manager:
            raise bad_request("PATCH, application/apply-patch+yaml: fieldManager is required "
                              "for apply requests")
        if not isinstance(body, dict):
            raise bad_request("apply patch body must be an object")
        if not body.get("apiVersion") or not body.get("kind"):
            raise bad_request("invalid object: apiVersion and kind must be set in an apply "
                              "patch")
        body = self._check_body(res, body, ns, name)
        if not (body.get("metadata") or {}).get("name"):
            raise bad_request("metadata.name must be set in an apply patch")
        existing = self.find(res, ns, name)
        if existing is not None:
            self._precondition(res, existing,
                               (body.get("metadata") or {}).get("resourceVersion"), name)
            merged, owners = apply_config(existing, self._owners_of(res, ns, name), body,
                                          manager, subresource, res.api_version, force, now,
                                          res.qualified, name)
            new = self._rebuild(res, existing, merged, subresource)
            return self._write(res, ns, name, existing, new, owners, dry_run)
        if subresource:
            raise self._not_found(res, name)
        self._check_namespace(res, ns)
        skeleton = self._skeleton(res, ns, name, {})
        merged, owners = apply_config(skeleton, {}, body, manager, "", res.api_version, force,
                                      now, res.qualified, name)
        merged.pop("status", None)
        new = self._finish(res, merged, None)
        if dry_run:
            return WriteResult(new, False, True)
        return WriteResult(self._commit(res, ns, name, new, owners, "ADDED", None), True, True)

    def delete(self, res: ResourceType, ns: str, name: str, options: Any = None,
               dry_run: bool = False) -> WriteResult:
        existing = self.get(res, ns, name)
        pre = (options or {}).get("preconditions") or {} if isinstance(options, dict) else {}
        self._precondition(res, existing, pre.get("resourceVersion"), name)
        if pre.get("uid") not in (None, "", existing["metadata"]["uid"]):
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: "
                                            f"{pre['uid']}, UID in object meta: "
                                            f"{existing['metadata']['uid']}")
        if dry_run:
            return WriteResult(existing, False)
        if res.plural == "namespaces":
            for other in self.by_plural.values():
                if not other.namespaced:
                    continue
                for key in [k for k in self.objects[other.plural] if k[0] == name]:
                    old = self.objects[other.plural][key]
                    self._commit(other, name, key[1], None, {}, "DELETED", old)
        return WriteResult(self._commit(res, ns, name, None, {}, "DELETED", existing), True)

    def put_raw(self, obj: Obj) -> Obj:
        """Store ``obj`` as given (no validation, defaulting or namespace check)."""
        res = self.resource_of(obj)
        md = obj.setdefault("metadata", {})
        name = md["name"]
        ns = md.get("namespace", "") if res.namespaced else ""
        existing = self.find(res, ns, name)
        new = copy.deepcopy(obj)
        nmd = new["metadata"]
        if existing is not None:
            nmd.setdefault("uid", existing["metadata"]["uid"])
            nmd.setdefault("creationTimestamp", existing["metadata"]["creationTimestamp"])
        else:
            nmd.setdefault("uid", str(uuid.uuid4()))
            nmd.setdefault("creationTimestamp", now_rfc3339())
        if res.has_generation:
            nmd.setdefault("generation", (existing or {}).get("metadata", {}).get(
                "generation", 0) + 1)
        return self._commit(res, ns, name, new, self._owners_of(res, ns, name),
                            "MODIFIED" if existing is not None else "ADDED", existing)


__all__ = [
    "CRD_GROUP",
    "DEFAULT_RESOURCES",
    "ApiError",
    "ManagerEntry",
    "Obj",
    "Requirement",
    "ResourceType",
    "Store",
    "WatchEvent",
    "WriteResult",
    "fields_match",
    "json_patch",
    "labels_match",
    "merge_patch",
    "parse_field_selector",
    "parse_label_selector",
    "reason_for",
    "status_body",
    "too_large_resource_version",
]
