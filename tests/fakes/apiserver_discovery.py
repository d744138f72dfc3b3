"""API discovery of the fake Kubernetes API server.

Follows kube-apiserver's discovery documents: ``/apis`` (``APIGroupList``),
``/apis/{group}`` (``APIGroup``), ``/api/v1`` and ``/apis/{group}/{version}``
(``APIResourceList`` with each resource and its ``/status`` subresource, verbs, short
names). A CRD that is not installed is absent, and its group 404s once empty.
"""

from __future__ import annotations

from tests.fakes.apiserver_errors import ApiError
from tests.fakes.apiserver_resources import Obj, ResourceType
from tests.fakes.apiserver_store import Store


class Discovery:
    """The discovery documents of :class:`~tests.fakes.apiserver.FakeApiServer`."""

    store: Store

    def _installed(self) -> list[ResourceType]:
        return [r for r in self.store.by_plural.values() if r.plural in self.store.installed]

    def _group_list(self) -> Obj:
        groups: dict[str, list[str]] = {}
        for r in self._installed():
            if r.group:
                versions = groups.setdefault(r.group, [])
                if r.version not in versions:
                    versions.append(r.version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            _group_obj(g, vs) for g, vs in groups.items()]}

    def _group(self, group: str) -> Obj:
        versions = []
        for r in self._installed():
            if r.group == group and r.version not in versions:
                versions.append(r.version)
        if not versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        return {"kind": "APIGroup", "apiVersion": "v1", **_group_obj(group, versions)}

    def _resource_list(self, group: str, version: str) -> Obj:
        rows = [r for r in self._installed() if r.group == group and r.version == version]
        if not rows:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        resources: list[Obj] = []
        for r in rows:
            resources.append({
                "name": r.plural, "singularName": r.singular or r.kind.lower(),
                "namespaced": r.namespaced, "kind": r.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch",
                          "update", "watch"],
                "shortNames": list(r.short_names)})
            resources.append({"name": f"{r.plural}/status", "singularName": "",
                              "namespaced": r.namespaced, "kind": r.kind,
                              "verbs": ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}


def _group_obj(group: str, versions: list[str]) -> Obj:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


__all__ = ["Discovery"]
