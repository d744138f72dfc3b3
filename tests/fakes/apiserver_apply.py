"""Field ownership and server-side apply of the fake Kubernetes API server (simplified).

Follows kube-apiserver's ``metadata.managedFields`` (FieldsV1, one entry per manager,
operation and subresource): an update (create, PUT, merge/JSON patch) takes ownership of
the fields it changes; an apply removes the fields its manager stopped applying (unless
another manager owns them) and is a 409 ``Conflict`` with ``FieldManagerConflict`` causes
when it would change another manager's field, unless forced. Simplified: ownership is at
leaf granularity and every list is atomic (true for CRDs without list-type markers).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tests.fakes.apiserver_errors import ApiError
from tests.fakes.apiserver_resources import Obj

Path = tuple[str, ...]

_MISSING: Any = object()


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

USER_METADATA = ("labels", "annotations", "ownerReferences", "finalizers")
SYSTEM_METADATA = (
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
            for mkey in USER_METADATA:
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


def parse_managed_fields(items: Iterable[Any]) -> Owners:
    """What :func:`render_managed_fields` rendered, read back (an object restored as stored)."""
    owners: Owners = {}
    for item in items:
        if not isinstance(item, dict) or not item.get("manager"):
            continue
        fields: set[Path] = set()

        def walk(node: Any, prefix: Path, fields: set[Path] = fields) -> None:
            children = {k: v for k, v in (node or {}).items() if k.startswith("f:")}
            if not children:
                fields.add(prefix)
            for key, sub in children.items():
                walk(sub, (*prefix, key[2:]))

        walk(item.get("fieldsV1") or {}, ())
        fields.discard(())
        key = (str(item["manager"]), str(item.get("operation", "Update")),
               str(item.get("subresource", "")))
        owners[key] = ManagerEntry(key[0], key[1], key[2], str(item.get("apiVersion", "")),
                                   fields, str(item.get("time", "")))
    return owners


def _copy_owners(owners: Owners) -> Owners:
    return {
        k: ManagerEntry(e.manager, e.operation, e.subresource, e.api_version, set(e.fields),
                        e.time)
        for k, e in owners.items()
    }


def owner_sets(owners: Owners) -> dict[OwnerKey, frozenset[Path]]:
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
                "message": f'conflict with "{m}" using {api_version}',
                "field": "." + ".".join(p),
            }
            for p, managers in sorted(conflicts.items())
            for m in sorted(managers)
        ]
        # kube-apiserver's wording (structured-merge-diff's): one conflict on one line,
        # more grouped by manager, each "conflicts with", its fields listed under it.
        if len(causes) == 1:
            said = f"{causes[0]['message']}: {causes[0]['field']}"
        else:
            by_manager: dict[str, list[str]] = {}
            for p, managers in sorted(conflicts.items()):
                for m in managers:
                    by_manager.setdefault(m, []).append("." + ".".join(p))
            said = "\n".join(f'conflicts with "{m}" using {api_version}:\n'
                             + "\n".join(f"- {f}" for f in fields)
                             for m, fields in sorted(by_manager.items()))
        raise ApiError(
            409,
            "Conflict",
            f"Apply failed with {len(causes)} conflict{'s' if len(causes) != 1 else ''}:"
            f" {said}",
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
        for mkey in USER_METADATA:
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


__all__ = [
    "ManagerEntry",
    "OwnerKey",
    "Owners",
    "Path",
    "apply_config",
    "fields_v1",
    "parse_managed_fields",
    "render_managed_fields",
    "scoped_leaves",
    "update_ownership",
]
