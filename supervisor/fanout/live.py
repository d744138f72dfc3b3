"""What the children look like right now: watched caches (:class:`LiveChildren`,
:class:`ForeignChildren`), and the drift test (:func:`covers`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import trio

from supervisor.fanout.labels import INSTALLATION_KEY
from supervisor.fanout.ownership import MANAGERS_FIELD, labels_of, managers_of
from supervisor.kube.applying import ChildKey, Desired
from supervisor.kube.errors import DecodeError
from supervisor.kube.models import Resource

__all__ = ["ChildIndex", "ForeignChildren", "LiveChildren", "Obj", "ResourceHandler", "child_name",
           "covers", "terminating", "unavailable"]

Obj = dict[str, Any]


def _empty(value: Any) -> bool:
    """A zero value, which the server omits from what it returns (Go's ``omitempty``)."""
    if isinstance(value, bool):
        return value is False
    return value is None or (isinstance(value, (int, float)) and value == 0) or (
        isinstance(value, (str, list, dict)) and not value)


def covers(live: Any, want: Any) -> bool:
    """True when every field set in ``want`` has the same value in ``live``: no drift.

    Maps: each key we set; lists: same length, element by element. Fields the server
    added (defaults, status, managedFields) do not count, so an unchanged child is
    never rewritten. A changed ``replicas`` or image, or a removed label of ours, is
    drift.

    A field we set to a zero value (``""``, 0, false, empty) that the server left out
    counts as the same. Its types omit such fields (an env var's ``value: ""``), so the
    live object can never show it: no drift.
    """
    if isinstance(want, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(covers(live[key], value) if key in live else _empty(value)
                   for key, value in want.items())
    if isinstance(want, list):
        if not isinstance(live, list) or len(live) != len(want):
            return False
        return all(covers(a, b) for a, b in zip(live, want, strict=True))
    if isinstance(want, bool) or isinstance(live, bool):
        return live is want
    return bool(live == want)


def child_name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _rv(obj: Mapping[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _older(obj: Obj, than: Obj | int | None, *, or_same: bool) -> bool:
    """Is ``obj``'s resourceVersion below ``than``'s (an object's, or one), both integers?"""
    rv, other = _rv(obj), _rv(than) if isinstance(than, Mapping) else than
    return rv is not None and other is not None and (rv <= other if or_same else rv < other)


_META_KEPT = ("name", "namespace", "resourceVersion", "generation", "labels", "annotations",
              "deletionTimestamp")
_STATUS_KEPT = ("observedGeneration", "availableReplicas")


def _slim(obj: Obj) -> Obj:
    """What is compared and read of a child: metadata we set, the spec, two status fields.

    managedFields (but who wrote it: :func:`~supervisor.fanout.ownership.managers_of`),
    status conditions and the like are large and never read: not held.
    """
    metadata = obj.get("metadata") or {}
    slim: Obj = {key: value for key, value in obj.items()
                 if key not in ("metadata", "status")}
    slim["metadata"] = {key: metadata[key] for key in _META_KEPT if key in metadata}
    # Who wrote it (manager -> operations), for the delete rule: not the fields they own.
    slim["metadata"][MANAGERS_FIELD] = {
        manager: sorted(ops) for manager, ops in managers_of(obj).items()}
    status = obj.get("status")
    if isinstance(status, Mapping):
        slim["status"] = {key: status[key] for key in _STATUS_KEPT if key in status}
    return slim


def terminating(obj: Mapping[str, Any] | None) -> bool:
    """Is ``obj`` being deleted already (a finalizer holds it)? Then deleting it again is moot."""
    return obj is not None and bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def unavailable(child: Desired, live: Mapping[str, Any] | None) -> str | None:
    """None when ``child`` is available, else why not (for the Available message).

    A Deployment is available when its ``availableReplicas`` reach ``replicas`` and its
    controller observed the current generation. Any other child is, once it exists.
    """
    if live is None:
        return f"{child.resource.kind} {child.name} does not exist"
    if child.resource.kind != "Deployment":
        return None
    want = int((child.body.get("spec") or {}).get("replicas", 1))
    status = live.get("status") or {}
    generation = (live.get("metadata") or {}).get("generation", 0)
    if status.get("observedGeneration", 0) < generation:
        return f"Deployment {child.name}: rollout of generation {generation} not observed yet"
    have = int(status.get("availableReplicas") or 0)
    if have < want:
        return f"Deployment {child.name}: {have}/{want} replicas available"
    return None


class ChildIndex:
    """What a child resource's informer feeds (a list, an upsert, a delete), for one kind.

    Each change enqueues the parent the lineage label names. :attr:`synced` tells when
    every child resource has been listed since the informers (re)started; :meth:`clear`
    starts over.
    """

    def __init__(self, resources: Iterable[Resource], lineage_key: str,
                 enqueue: Callable[[str], None]) -> None:
        self._lineage_key = lineage_key
        self._enqueue = enqueue
        self._resources = tuple(resources)
        self._listed: set[str] = set()
        self._all_listed = trio.Event()
        self.clear()

    @property
    def synced(self) -> bool:
        """Every child resource has been listed at least once."""
        return all(res.plural in self._listed for res in self._resources)

    async def wait_synced(self) -> None:
        """Return once every child resource has been listed."""
        while not self.synced:
            await self._all_listed.wait()

    def _mark_listed(self, resource: Resource) -> bool:
        """``resource`` was (re)listed: True the first time since :meth:`clear`."""
        first = resource.plural not in self._listed
        self._listed.add(resource.plural)
        if self.synced:
            self._all_listed.set()
        return first

    def clear(self) -> None:
        """Forget everything (the informers are restarting)."""
        self._listed.clear()
        if self._all_listed.is_set():
            self._all_listed = trio.Event()

    def parent_of(self, obj: Mapping[str, Any]) -> str:
        return str(labels_of(obj).get(self._lineage_key, ""))

    def _enqueue_all(self, parents: Iterable[str]) -> None:
        for parent in parents:
            if parent:
                self._enqueue(parent)


class ResourceHandler:
    """The informer handler of one child resource, delegating to a :class:`ChildIndex`
    (:class:`LiveChildren` here, ``ForeignChildren`` for other installations' children)."""

    def __init__(self, owner: LiveChildren | ForeignChildren, resource: Resource) -> None:
        self._owner = owner
        self._resource = resource

    async def on_list(self, items: Mapping[str, Obj], skewed: set[str]) -> None:
        self._owner.replace(self._resource, items.values())

    def on_upsert(self, obj: Obj, name: str) -> None:
        self._owner.observe(self._resource, obj)

    def on_delete(self, name: str) -> None:
        self._owner.forget(self._resource, name)

    def on_skewed(self, name: str, error: DecodeError) -> None:
        pass  # a child is read as a plain map: only malformed JSON lands here, and is skipped


class LiveChildren(ChildIndex):
    """The watched children of one kind, as the API server last told us.

    Every child of the kind's child resources in the apps namespace, selected by the
    managed-by, installation and lineage labels: nothing foreign is held. An informer
    handler for each child resource (:class:`ResourceHandler`). Every change or delete enqueues
    the parent the lineage label names: a child deleted or edited by hand is repaired
    within a moment, not at the next resync.
    """

    def clear(self) -> None:
        super().clear()
        self._objects: dict[ChildKey, Obj] = {}
        self._by_parent: dict[str, set[ChildKey]] = {}
        # key -> resourceVersion of the child when its DELETED event came: a write's answer
        # arriving after that event is not newer than what was deleted, and is not held.
        self._gone: dict[ChildKey, int] = {}

    def get(self, key: ChildKey) -> Obj | None:
        return self._objects.get(key)

    def of_parent(self, parent: str) -> set[ChildKey]:
        return set(self._by_parent.get(parent, ()))

    def items(self) -> list[tuple[ChildKey, Obj]]:
        return list(self._objects.items())

    def __len__(self) -> int:
        return len(self._objects)

    # -- updates -------------------------------------------------------------------

    def _unindex(self, key: ChildKey, old: Obj) -> str:
        parent = self.parent_of(old)
        keys = self._by_parent.get(parent)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_parent[parent]
        return parent

    def _store(self, key: ChildKey, obj: Obj) -> str:
        old = self._objects.get(key)
        if old is not None:
            self._unindex(key, old)
        obj = _slim(obj)
        self._gone.pop(key, None)
        self._objects[key] = obj
        parent = self.parent_of(obj)
        self._by_parent.setdefault(parent, set()).add(key)
        return parent

    def discard(self, key: ChildKey) -> str | None:
        """Drop a child, without an enqueue (as after our own delete); its parent, if held."""
        old = self._objects.pop(key, None)
        return self._unindex(key, old) if old is not None else None

    def replace(self, resource: Resource, objects: Iterable[Obj]) -> None:
        """A (re)list of ``resource``: its children are exactly ``objects``."""
        self._gone = {k: rv for k, rv in self._gone.items() if k.plural != resource.plural}
        touched = {self.discard(key) or "" for key in
                   [k for k in self._objects if k.plural == resource.plural]}
        touched.update(self._store(ChildKey(resource.plural, child_name(obj)), obj)
                       for obj in objects)
        if not self._mark_listed(resource):  # a relist: whatever changed meanwhile gets a look
            self._enqueue_all(sorted(touched))

    def observe(self, resource: Resource, obj: Obj) -> None:
        """A watch event: hold ``obj`` unless what is held is newer; enqueue its parent.

        Newer by resourceVersion, compared as integers when both are (etcd revisions).
        An event not newer neither replaces nor enqueues: our own write's event is no
        reason to reconcile again.
        """
        key = ChildKey(resource.plural, child_name(obj))
        held = self._objects.get(key)
        if _older(obj, held, or_same=True):
            # Older than what our own write returned, or the event of that very write:
            # nothing we do not hold already, so nothing to reconcile.
            return
        old_parent = self.parent_of(held) if held is not None else ""
        self._enqueue_all({old_parent, self._store(key, obj)})

    def put(self, resource: Resource, obj: Obj) -> None:
        """Hold what a write of ours just returned (no enqueue: we just reconciled it).

        So a reconcile right after our apply sees it before its watch event. Not held
        when not newer than a child whose DELETED event came first.
        """
        key = ChildKey(resource.plural, child_name(obj))
        # Not when a child deleted after this write had its DELETED event first.
        if not (_older(obj, self._objects.get(key), or_same=False)
                or _older(obj, self._gone.get(key), or_same=True)):
            self._store(key, obj)

    def forget(self, resource: Resource, name: str) -> None:
        """A child is gone (watch DELETED, or our own delete): enqueue its parent."""
        key = ChildKey(resource.plural, name)
        rv = _rv(self._objects.get(key) or {})
        if rv is not None:
            if len(self._gone) > 10_000:  # bounded: an old answer this late is not expected
                self._gone.clear()
            self._gone[key] = rv
        self._enqueue_all([self.discard(key) or ""])


class ForeignChildren(ChildIndex):
    """Which of this kind's child names another installation holds; never ours to write.

    Two installations may share an apps namespace (docs/operations.md, "The fan-out
    controller"). Children are named after their parent: with a parent of the same
    name, both want one child. ``force`` would take the other's child over, it would
    repair it back, and so on. Our own watch selects on our installation label, so
    that child looks absent. Hence one more watch per child resource
    (:func:`~supervisor.fanout.labels.foreign_selector`). The reconcile leaves a child
    :meth:`owner` names alone, reporting ``Conflict``. Its change or delete enqueues
    our parent of the same name: ours is created once the other is gone. A child with
    no installation label (an older build) is not foreign: its parent adopts it.
    """

    def clear(self) -> None:
        super().clear()
        # key -> (installation, parent named by the lineage label)
        self._held: dict[ChildKey, tuple[str, str]] = {}

    def owner(self, key: ChildKey) -> str | None:
        """The other installation holding ``key``, if any."""
        held = self._held.get(key)
        return held[0] if held is not None else None

    def replace(self, resource: Resource, objects: Iterable[Obj]) -> None:
        touched = {parent for key, (_, parent) in self._held.items()
                   if key.plural == resource.plural}
        self._held = {key: value for key, value in self._held.items()
                      if key.plural != resource.plural}
        touched.update(self._store(resource, obj) for obj in objects)
        self._mark_listed(resource)
        self._enqueue_all(sorted(touched))

    def observe(self, resource: Resource, obj: Obj) -> None:
        self._enqueue_all([self._store(resource, obj)])

    def forget(self, resource: Resource, name: str) -> None:
        held = self._held.pop(ChildKey(resource.plural, name), None)
        self._enqueue_all([held[1]] if held is not None else [])

    def _store(self, resource: Resource, obj: Obj) -> str:
        parent = self.parent_of(obj)
        self._held[ChildKey(resource.plural, child_name(obj))] = (
            str(labels_of(obj).get(INSTALLATION_KEY, "")), parent)
        return parent
