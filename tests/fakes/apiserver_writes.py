"""Write semantics of the fake Kubernetes API server's store: create, replace, patch, delete.

Follows kube-apiserver: the body's apiVersion, kind, namespace and name must match the URL
(400); create is 409 ``AlreadyExists`` for an existing name and 404 in a missing namespace;
``metadata.resourceVersion`` and ``uid`` preconditions are 409 ``Conflict``; a PUT without a
``metadata.resourceVersion`` is an unconditional update, refused with 422 ``Invalid`` for the
kinds whose strategy forbids it (Leases: :data:`NO_UNCONDITIONAL_UPDATE`); a write to
``/status`` changes only ``.status`` and a write to the main resource ignores it;
``generation`` moves only when something outside metadata and status changes; a write
that changes nothing (content and field ownership) is not committed (no new RV, no watch
event); ``dryRun`` answers without storing; deleting a namespace deletes its contents.

:class:`ObjectWrites` is a mixin of :class:`tests.fakes.apiserver_store.Store`, which
provides the objects, ``_commit`` (new RV, history, watch event) and the lookups.
"""

from __future__ import annotations

import copy
import datetime as _dt
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.fakes.apiserver_apply import (
    SYSTEM_METADATA,
    USER_METADATA,
    Owners,
    apply_config,
    owner_sets,
    parse_managed_fields,
    update_ownership,
)
from tests.fakes.apiserver_defaults import apply_defaults
from tests.fakes.apiserver_errors import ApiError, bad_request
from tests.fakes.apiserver_patches import json_patch, merge_patch
from tests.fakes.apiserver_resources import Obj, ResourceType
from tests.fakes.apiserver_validation import validate

# Resources whose kube-apiserver strategy answers AllowUnconditionalUpdate() false:
# a PUT must name the resourceVersion it replaces (coordination/lease strategy.go).
NO_UNCONDITIONAL_UPDATE = frozenset({("coordination.k8s.io", "leases")})


@dataclass
class WriteResult:
    obj: Obj
    changed: bool
    created: bool = False


def now_rfc3339() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def key_order(obj: Obj) -> Obj:
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


class ObjectWrites:
    """The writes of :class:`~tests.fakes.apiserver_store.Store` (which provides the rest)."""

    # provided by Store
    defaulting: bool
    validation: bool
    objects: dict[str, dict[tuple[str, str], Obj]]
    owners: dict[tuple[str, str, str], Owners]
    by_plural: dict[str, ResourceType]
    _alloc_ip: Callable[[], str]
    _key: Callable[[ResourceType, str | None], str]
    _not_found: Callable[[ResourceType, str], ApiError]
    _check_namespace: Callable[[ResourceType, str], None]
    get: Callable[[ResourceType, str | None, str], Obj]
    find: Callable[[ResourceType, str | None, str], Obj | None]
    resource_of: Callable[[Obj], ResourceType]
    _commit: Callable[..., Obj]

    def _finish(self, res: ResourceType, new: Obj, old: Obj | None) -> Obj:
        new = key_order(new)
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
        for k in USER_METADATA:
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
        if _content(new) == _content(existing) and owner_sets(owners) == owner_sets(
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
              if k in SYSTEM_METADATA}
        cmd = candidate.get("metadata") or {}
        for k in USER_METADATA:
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
        if md.get("resourceVersion") in (None, "") and (res.group, res.plural) in \
                NO_UNCONDITIONAL_UPDATE:
            # kube-apiserver 1.20's answer, verbatim (measured on /tmp/realkube).
            raise ApiError(422, "Invalid", f'{res.kind}.{res.group} "{name}" is invalid: '
                           "metadata.resourceVersion: Invalid value: 0x0: must be specified "
                           "for an update",
                           details={"name": name, "group": res.group, "kind": res.kind,
                                    "causes": [{"reason": "FieldValueInvalid",
                                                "message": "Invalid value: 0x0: must be "
                                                           "specified for an update",
                                                "field": "metadata.resourceVersion"}]})
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
        owners = self._owners_of(res, ns, name)
        given = (patched.get("metadata") or {}).get("managedFields")
        if isinstance(given, list) and given != (existing.get("metadata") or {}).get(
                "managedFields"):
            owners = parse_managed_fields(given)  # written by the request: taken as given
        owners = update_ownership(owners, manager or "unknown", subresource, res.api_version,
                                  existing, new, now)
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
        """Store ``obj`` as given (no validation, defaulting or namespace check); its
        ``managedFields``, when it has them, are its field owners (as etcd keeps them)."""
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
        stored = md.get("managedFields")
        owners = (parse_managed_fields(stored) if isinstance(stored, list)
                  else self._owners_of(res, ns, name))
        return self._commit(res, ns, name, new, owners,
                            "MODIFIED" if existing is not None else "ADDED", existing)


__all__ = ["ObjectWrites", "WriteResult", "now_rfc3339"]
