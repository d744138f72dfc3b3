"""JSON merge patch and JSON patch, as the fake Kubernetes API server applies them.

``application/merge-patch+json`` is RFC 7386 (``null`` removes a key, lists are replaced);
``application/json-patch+json`` is RFC 6902 (add, remove, replace, move, copy, test), with a
failed ``test`` or a missing path answered 422 ``Invalid`` as kube-apiserver does. Strategic
merge patch is routed here as a merge patch (see :mod:`tests.fakes.apiserver_routing`);
server-side apply is :mod:`tests.fakes.apiserver_apply`.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.fakes.apiserver_errors import ApiError, bad_request


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


__all__ = ["json_patch", "merge_patch"]
