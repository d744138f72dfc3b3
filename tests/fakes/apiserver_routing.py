"""Routing of the fake Kubernetes API server: from a path and a verb to the store.

Follows kube-apiserver's REST layout: ``/api/v1/...`` and ``/apis/{group}/{version}/...``,
``namespaces/{ns}/{plural}[/{name}[/status]]``, all-namespace lists and watches, the
legacy ``/watch/`` prefix, ``/version``; RBAC verbs derived as the real authorizer does
(get/list/watch/create/update/patch/delete/deletecollection); POST 201, PUT, PATCH by
content type (merge, JSON, apply; strategic merge as a merge patch for built-in resources
and 415 for CRDs), DELETE and deletecollection, ``dryRun=All``; lists with ``limit`` and
``continue``; 404 Status bodies for unknown paths and 405 for unsupported methods.
"""

from __future__ import annotations

from collections.abc import Mapping

from tests.fakes.apiserver_errors import ApiError, too_large_resource_version
from tests.fakes.apiserver_http import (
    Receive,
    Send,
    parse_json,
    parse_yaml,
    respond_json,
    truthy,
)
from tests.fakes.apiserver_requests import RecordedRequest
from tests.fakes.apiserver_resources import Obj, ResourceType
from tests.fakes.apiserver_selectors import parse_field_selector, parse_label_selector
from tests.fakes.apiserver_store import Store

_PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


class Routing:
    """The REST routes of :class:`~tests.fakes.apiserver.FakeApiServer` (watches are
    :class:`~tests.fakes.apiserver_watch.WatchStreams`, discovery documents
    :class:`~tests.fakes.apiserver_discovery.Discovery`, authorization
    :class:`~tests.fakes.apiserver_faults.FaultControl`)."""

    store: Store

    async def _dispatch(self, method: str, path: str, query: dict[str, str],
                        headers: Mapping[str, str], raw: bytes, rec: RecordedRequest,
                        receive: Receive, send: Send) -> None:
        parts = [p for p in path.split("/") if p]
        if parts == ["version"]:
            rec.status = 200
            await respond_json(send, 200, {"major": "1", "minor": "31",
                                           "gitVersion": "v1.31.0-fake",
                                           "platform": "linux/amd64"})
            return
        if not parts or parts[0] not in ("api", "apis"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        if parts[0] == "api":
            if len(parts) == 1:
                rec.status = 200
                await respond_json(send, 200, {"kind": "APIVersions", "versions": ["v1"]})
                return
            group, version, rest = "", parts[1], parts[2:]
        else:
            if len(parts) == 1:
                rec.status = 200
                await respond_json(send, 200, self._group_list())
                return
            if len(parts) == 2:
                rec.status = 200
                await respond_json(send, 200, self._group(parts[1]))
                return
            group, version, rest = parts[1], parts[2], parts[3:]
        watch = False
        if rest[:1] == ["watch"]:
            watch, rest = True, rest[1:]
        if not rest:
            rec.status = 200
            await respond_json(send, 200, self._resource_list(group, version))
            return
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (
                len(rest) == 3 and rest[2] in ("status", "finalize")):
            ns, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        watch = watch or truthy(query.get("watch"))
        verb = _verb(method, name is not None, watch)
        self._authorize(verb, f"{plural}/{sub}" if sub else plural, group, ns, name)
        res = self.store.lookup(group, version, plural)
        if sub and sub != "status":
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        if res.namespaced and ns is None and name is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        if not res.namespaced and ns is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        if watch:
            rec.watch = True
            await self._watch(res, ns, name, query, rec, receive, send)
            return
        manager = query.get("fieldManager") or _default_manager(headers)
        dry_run = query.get("dryRun") == "All"
        nsv = ns or ""
        if method == "GET":
            if name is None:
                await self._list(res, ns, query, rec, send)
                return
            rec.status = 200
            await respond_json(send, 200, self.store.get(res, ns, name))
            return
        if method == "POST" and name is None:
            if ns is None and res.namespaced:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method "
                                                        "on the requested resource")
            body = parse_json(raw)
            rec.body = body
            result = self.store.create(res, nsv, body, manager, dry_run)
            rec.changed = result.changed
            rec.status = 201
            await respond_json(send, 201, result.obj)
            return
        if method == "PUT" and name is not None:
            body = parse_json(raw)
            rec.body = body
            result = self.store.replace(res, nsv, name, body, manager, sub, dry_run)
            rec.changed = result.changed
            rec.status = 200
            await respond_json(send, 200, result.obj)
            return
        if method == "PATCH" and name is not None:
            ctype = (headers.get("content-type") or "").split(";")[0].strip().lower()
            ptype = _PATCH_TYPES.get(ctype)
            if ptype is None or (ptype == "strategic" and res.crd):
                raise ApiError(
                    415, "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: application/json-patch+json, application/merge-patch+json, "
                    f"application/apply-patch+yaml{'' if res.crd else ', application/strategic-merge-patch+json'}")
            if ptype == "strategic":
                ptype = "merge"
            body = parse_yaml(raw) if ptype == "apply" else parse_json(raw)
            rec.body = body
            apply_manager = query.get("fieldManager") if ptype == "apply" else manager
            result = self.store.patch(res, nsv, name, ptype, body, apply_manager, sub,
                                      truthy(query.get("force")), dry_run)
            rec.changed = result.changed
            rec.status = 201 if result.created else 200
            await respond_json(send, rec.status, result.obj)
            return
        if method == "DELETE" and name is not None and not sub:
            options = parse_json(raw) if raw.strip() else None
            rec.body = options
            if query.get("dryRun") == "All" or (isinstance(options, dict) and options.get(
                    "dryRun") == ["All"]):
                dry_run = True
            result = self.store.delete(res, nsv, name, options, dry_run)
            rec.changed = result.changed
            rec.status = 200
            await respond_json(send, 200, result.obj)
            return
        if method == "DELETE" and name is None:
            items, _, _, _ = self.store.list_objects(
                res, ns, labels=parse_label_selector(query.get("labelSelector")),
                fields=parse_field_selector(query.get("fieldSelector")))
            deleted = []
            for obj in list(items):
                md = obj["metadata"]
                if not dry_run:
                    deleted.append(self.store.delete(res, md.get("namespace", ""),
                                                     md["name"]).obj)
                else:
                    deleted.append(obj)
            rec.changed = bool(deleted) and not dry_run
            rec.status = 200
            await respond_json(send, 200, {
                "kind": res.list_kind, "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(self.store.rv)}, "items": deleted})
            return
        raise ApiError(405, "MethodNotAllowed",
                       "the server does not allow this method on the requested resource")

    async def _list(self, res: ResourceType, ns: str | None, query: Mapping[str, str],
                    rec: RecordedRequest, send: Send) -> None:
        limit = None
        if query.get("limit"):
            try:
                limit = int(query["limit"])
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"invalid limit: {query['limit']}") from exc
        exact = query.get("resourceVersionMatch") == "Exact"
        rv_param = query.get("resourceVersion", "")
        if rv_param.isdigit() and not await self._reached(int(rv_param)):
            raise too_large_resource_version(int(rv_param), self.store.rv)
        if exact and query.get("resourceVersion", "").isdigit() and int(
                query["resourceVersion"]) < self.store.floor:
            raise ApiError(410, "Expired", f"too old resource version: "
                                           f"{query['resourceVersion']} ({self.store.floor})")
        items, rv, cont, remaining = self.store.list_objects(
            res, ns,
            labels=parse_label_selector(query.get("labelSelector")),
            fields=parse_field_selector(query.get("fieldSelector")),
            limit=limit, cont=query.get("continue") or None)
        meta: Obj = {"resourceVersion": rv}
        if cont:
            meta["continue"] = cont
            meta["remainingItemCount"] = remaining
        rec.status = 200
        await respond_json(send, 200, {"kind": res.list_kind, "apiVersion": res.api_version,
                                       "metadata": meta, "items": items})


def _verb(method: str, named: bool, watch: bool) -> str:
    if watch:
        return "watch"
    return {
        "GET": "get" if named else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }.get(method, method.lower())


def _default_manager(headers: Mapping[str, str]) -> str:
    agent = headers.get("user-agent", "unknown")
    return agent.split("/")[0] or "unknown"


__all__ = ["Routing"]
