"""Direct state access of the fake Kubernetes API server, for tests (no HTTP).

The same store and semantics as the HTTP API (validation, defaulting, field ownership,
RVs, watch events), reached without a client: create, apply, merge patch, ``set_status``
(what a controller such as the Deployment controller writes), delete, ``put_raw``
(bypassing validation, for schema-skew cases), plus what a cluster operator does:
``compact()`` (etcd compaction), ``reset_state()`` (etcd restored from an empty backup),
CRD install/uninstall.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

from tests.fakes.apiserver_resources import Obj, ResourceType
from tests.fakes.apiserver_selectors import parse_label_selector
from tests.fakes.apiserver_store import Store


class DirectState:
    """The state methods of :class:`~tests.fakes.apiserver.FakeApiServer`."""

    store: Store
    _namespaces: tuple[str, ...]
    _notify: Callable[[], None]

    @property
    def resource_version(self) -> int:
        """The current (latest) global resourceVersion."""
        return self.store.rv

    def register_resource(self, res: ResourceType, *, installed: bool = True) -> None:
        self.store.register(res, installed=installed)

    def _res(self, plural: str) -> ResourceType:
        return self.store.resource(plural)

    def get(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        obj = self.store.find(self._res(plural), namespace, name)
        return copy.deepcopy(obj) if obj is not None else None

    def objects(self, plural: str, namespace: str | None = None, *,
                label_selector: str | None = None) -> list[Obj]:
        items, _, _, _ = self.store.list_objects(self._res(plural), namespace,
                                         labels=parse_label_selector(label_selector))
        return copy.deepcopy(items)

    def create(self, obj: Obj, *, field_manager: str = "fake-test") -> Obj:
        """Create like a POST (validation, defaulting, 409, missing namespace -> 404);
        raises :class:`ApiError`."""
        res = self.store.resource_of(obj)
        ns = _direct_namespace(res, obj)
        result = self.store.create(res, ns, copy.deepcopy(obj), field_manager)
        return copy.deepcopy(result.obj)

    def apply(self, obj: Obj, *, field_manager: str = "fake-test", force: bool = False,
              subresource: str = "") -> Obj:
        """Server-side apply as ``field_manager``; raises :class:`ApiError` (e.g. 409)."""
        res = self.store.resource_of(obj)
        md = obj.get("metadata") or {}
        ns = _direct_namespace(res, obj)
        result = self.store.patch(res, ns, md.get("name", ""), "apply", copy.deepcopy(obj),
                                  field_manager, subresource, force)
        return copy.deepcopy(result.obj)

    def patch(self, plural: str, namespace: str | None, name: str, patch: Obj, *,
              field_manager: str = "fake-test", subresource: str = "") -> Obj:
        """A JSON merge patch as ``field_manager`` (like ``kubectl edit``/``patch``)."""
        result = self.store.patch(self._res(plural), namespace or "", name, "merge",
                                  copy.deepcopy(patch), field_manager, subresource)
        return copy.deepcopy(result.obj)

    def set_status(self, plural: str, namespace: str | None, name: str, status: Obj, *,
                   field_manager: str = "fake-controller") -> Obj:
        """Replace ``.status`` (what a controller such as the Deployment controller does)."""
        res = self._res(plural)
        existing = self.store.get(res, namespace, name)
        body = copy.deepcopy(existing)
        body["status"] = copy.deepcopy(status)
        result = self.store.replace(res, namespace or "", name, body, field_manager, "status")
        return copy.deepcopy(result.obj)

    def delete(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        """Delete if present; returns the deleted object (None when absent)."""
        res = self._res(plural)
        if self.store.find(res, namespace, name) is None:
            return None
        return copy.deepcopy(self.store.delete(res, namespace or "", name).obj)

    def put_raw(self, obj: Obj) -> Obj:
        """Store ``obj`` bypassing validation and defaulting (schema-skew cases); watchers
        get ADDED/MODIFIED with it as given (plus uid/RV)."""
        return copy.deepcopy(self.store.put_raw(copy.deepcopy(obj)))

    def create_namespace(self, name: str) -> Obj:
        existing = self.get("namespaces", None, name)
        if existing is not None:
            return existing
        return self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def compact(self) -> int:
        """Drop the watch history: a watch (or continue token) from any RV older than the
        current one now gets 410 Expired. Returns the current RV."""
        rv = self.store.compact()
        self._notify()
        return rv

    def reset_state(self, *, keep_crds: bool = True,
                    namespaces: Iterable[str] | None = None) -> int:
        """An etcd restored from an empty backup behind a restarted API server: every object
        goes (no watch events), the resourceVersion counter starts again (so a client's RV
        is now newer than the server's: see "An RV newer than the server's" above), open
        watches end cleanly, and ``namespaces`` (None: those the server started with) are
        created again. The CRDs stay installed unless ``keep_crds=False``. Injections, deny
        rules, the token and the request log are the test's, not etcd's: they stay.
        Returns the new resourceVersion."""
        self.close_watches()
        self.store.reset(keep_crds=keep_crds)
        for ns in self._namespaces if namespaces is None else namespaces:
            self.create_namespace(ns)
        self._notify()
        return self.store.rv

    def uninstall_crd(self, plural: str, *, keep_objects: bool = False) -> None:
        """Remove a CRD: its paths 404 and it leaves discovery. Like a real CRD deletion its
        objects are deleted (DELETED events) and its watches end; ``keep_objects=True`` hides
        them instead, and they reappear on ``install_crd``."""
        res = self._res(plural)
        if not keep_objects:
            for key in sorted(self.store.objects[plural]):
                self.store.delete(res, key[0], key[1])
        self.store.installed.discard(plural)
        self.close_watches(plural, drain=True)

    def install_crd(self, plural: str) -> None:
        self._res(plural)
        self.store.installed.add(plural)
        self._notify()

    def crd_installed(self, plural: str) -> bool:
        return plural in self.store.installed


def _direct_namespace(res: ResourceType, obj: Obj) -> str:
    if not res.namespaced:
        return ""
    ns = (obj.get("metadata") or {}).get("namespace")
    if not ns:
        raise ValueError(f"{res.kind} {obj.get('metadata', {}).get('name')!r}: "
                         "metadata.namespace is required")
    return str(ns)


__all__ = ["DirectState"]
