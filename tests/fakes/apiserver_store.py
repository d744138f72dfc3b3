"""In-memory state of the fake Kubernetes API server: objects, resourceVersions, history.

This module is synchronous and HTTP-free: every mutation happens without an
``await``, so under trio it is atomic with respect to the HTTP handlers and
watch streams in :mod:`tests.fakes.apiserver`. See that module's docstring for
what is real and what is simplified.

Follows etcd behind kube-apiserver: one global resourceVersion counter (strings on the
wire) bumped by every committed write; a bounded history of committed changes
(:class:`WatchEvent`) that watches replay from an RV, with RVs older than the window (or
than ``compact()``) answered 410 ``Expired``; ``continue`` tokens carrying the list's RV;
``reset()`` as an etcd restored from an empty backup (the RV goes backwards). The writes
themselves are :mod:`tests.fakes.apiserver_writes`; the names of the pieces it is built
from (errors, selectors, patches, apply, validation, defaulting) are re-exported here.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tests.fakes.apiserver_apply import (
    ManagerEntry,
    OwnerKey,
    Owners,
    Path,
    apply_config,
    fields_v1,
    render_managed_fields,
    scoped_leaves,
    update_ownership,
)
from tests.fakes.apiserver_defaults import apply_defaults
from tests.fakes.apiserver_errors import (
    ApiError,
    bad_request,
    not_found_resource,
    reason_for,
    status_body,
    too_large_resource_version,
)
from tests.fakes.apiserver_patches import json_patch, merge_patch
from tests.fakes.apiserver_resources import Obj, ResourceType
from tests.fakes.apiserver_selectors import (
    Requirement,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from tests.fakes.apiserver_validation import validate
from tests.fakes.apiserver_writes import ObjectWrites, WriteResult, key_order, now_rfc3339

# --------------------------------------------------------------------------------------
# Resource table


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


class Store(ObjectWrites):
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
        obj = key_order(obj)
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


__all__ = [
    "CRD_GROUP",
    "DEFAULT_RESOURCES",
    "ApiError",
    "ManagerEntry",
    "Obj",
    "OwnerKey",
    "Owners",
    "Path",
    "Requirement",
    "ResourceType",
    "Store",
    "WatchEvent",
    "WriteResult",
    "apply_config",
    "apply_defaults",
    "bad_request",
    "fields_match",
    "fields_v1",
    "json_patch",
    "labels_match",
    "merge_patch",
    "not_found_resource",
    "now_rfc3339",
    "parse_field_selector",
    "parse_label_selector",
    "reason_for",
    "render_managed_fields",
    "scoped_leaves",
    "status_body",
    "too_large_resource_version",
    "update_ownership",
    "validate",
]
