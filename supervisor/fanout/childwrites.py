"""One parent's reconcile: :class:`ChildWriter` compares desired children with the watched ones.

The engine watches, queues and retries; this compares and writes. :class:`RepairLimiter`
keeps a fight with another writer from becoming a hot loop.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from collections.abc import Hashable, Mapping, Set
from dataclasses import dataclass
from typing import Any, Generic

import trio

from supervisor.backoff import Backoff
from supervisor.config import KubernetesConfig
from supervisor.fanout.drain import Drain
from supervisor.fanout.kind import FanoutKind, P
from supervisor.fanout.live import ForeignChildren, LiveChildren, Obj, covers, terminating
from supervisor.fanout.ownership import (
    conflict_managers,
    created_by_update,
    describe,
    folded_managed_fields,
    managers_of,
    our_managers,
    ours_to_write,
    written_by_us,
)
from supervisor.fanout.parentstatus import ParentReporter
from supervisor.fanout.workqueue import WorkQueue
from supervisor.kube.applying import DIGEST_ANNOTATION, ChildKey, Desired
from supervisor.kube.client import KubeClient
from supervisor.kube.errors import Conflict, Invalid, KubeError
from supervisor.kube.models import kube_time
from supervisor.telemetry import Metrics

__all__ = ["ChildWriter", "RepairLimiter"]


@dataclass(eq=False, kw_only=True)
class ChildWriter(Generic[P]):
    """Compares and writes one kind's children; owns what it remembers about past writes.

    ``parents`` and ``skewed`` are the engine's cache of parents (read, never
    written here); ``queue`` takes a parent back after a delay.
    """

    client: KubeClient
    kind: FanoutKind[P]
    config: KubernetesConfig
    metrics: Metrics
    log: Any
    # What the engine knows of the cluster.
    parents: Mapping[str, P]
    skewed: Set[str]
    live: LiveChildren
    foreign: ForeignChildren
    # Where the writer's results go.
    queue: WorkQueue
    drain: Drain
    reporter: ParentReporter

    def __post_init__(self) -> None:
        self._taken_said: dict[str, list[str]] = {}  # parent -> what was logged (once)
        self._unwritten_said: set[ChildKey] = set()
        self._managers = our_managers(self.config.field_manager)
        # The digest each child was last applied with: a child gone or changed while
        # we still want that digest was changed by someone else (drift).
        self._applied: dict[ChildKey, str] = {}
        self.repairs = RepairLimiter()
        self._fights: set[ChildKey] = set()  # children whose fight was logged
        # A deferred repair's time, and that time on the wall clock as the status says
        # it: computed once, so every reconcile during the deferral says the same.
        self._deferred: dict[ChildKey, tuple[float, str]] = {}
        # Children the server refused (422), by digest: not resent until they change
        # or the next resync, so a bad spec does not loop.
        self._refused: dict[ChildKey, tuple[str, Invalid]] = {}

    def forget_refusals(self) -> None:
        """Resend the children the server refused (422) at their next reconcile."""
        self._refused.clear()

    def claimant(self, key: ChildKey) -> str | None:
        """The existing parent that wants child ``key`` (children are named after theirs)."""
        # An unreadable parent: whatever it wants is left alone.
        wanted = key.name in self.skewed or any(
            c.key == key for c in self.desired(self.parents.get(key.name)))
        return key.name if wanted else None

    def desired(self, parent: P | None) -> list[Desired]:
        if parent is None or parent.metadata.deletion_timestamp is not None:
            return []
        config = self.config
        return self.kind.desired(parent, config.apps_namespace, config.installation_label)

    async def reconcile(self, name: str, parent: P | None) -> None:
        """Make ``name``'s children what ``parent`` wants (none when deleted or None).

        A child is written only when it differs (:func:`~supervisor.fanout.live.covers`:
        every field we set, same value). So nothing drifted writes nothing. Absent, it
        is created (POST); ours, server-side applied without ``force``
        (:meth:`_fold_created` first after our create). What is ours and when a conflict
        is forced: :mod:`supervisor.fanout.ownership`. What is refused, or held by
        another installation (:class:`~supervisor.fanout.live.ForeignChildren`), is left
        as it is, reported ``Conflict``.

        A child changed or deleted by someone else while we still want the digest we
        applied is **drift**: repaired at once (``DriftRepaired``,
        ``fanout_drift_repairs``). Only a repair the server accepted counts. A child of
        ours with no managedFields entry of ours left is **disowned**: repaired alike,
        since only what we wrote is ever deleted. A repair the :class:`RepairLimiter`
        defers requeues the parent for that time, reported ``RepairDeferred``, never
        ``Applied``.

        Children no longer desired, and a deleted parent's, are deleted. Never a child
        another parent wants (:meth:`claimant`: a hand-edited lineage label), nor one no
        manager of ours wrote (labels alone prove nothing). A child the server refused
        (422) is not resent until its digest changes or :meth:`forget_refusals` (the
        next resync): the earlier Invalid is raised again. Writes go through the
        :class:`~supervisor.fanout.drain.Drain`. Failures propagate as
        :class:`~supervisor.kube.errors.KubeError` for the engine to requeue. The
        parent's status (:mod:`supervisor.fanout.parentstatus`) and Events come after
        the children; ``Applied`` only with ``[kubernetes].applied_events``.
        """
        desired = self.desired(parent)
        applied: list[str] = []
        repaired: list[str] = []
        taken: list[str] = []
        deferred: list[str] = []
        for child in desired:
            live = self.live.get(child.key)
            owner = self.foreign.owner(child.key)
            if live is None and owner is not None:
                taken.append(f"{child.resource.kind} {self.config.apps_namespace}/{child.name}"
                             f" belongs to installation {owner} (two installations sharing"
                             " the apps namespace need different parent names)")
                continue
            if live is not None and not self._ours(live, name):
                taken.append(describe(live, child.resource.kind, self.config.apps_namespace,
                                      self.kind.lineage_key))
                continue
            covered = live is not None and covers(live, child.body)
            if covered and written_by_us(live or {}, self._managers):
                self.metrics.fanout_applies.labels(self.kind.kind, "unchanged").inc()
                self._fights.discard(child.key)
                self._deferred.pop(child.key, None)
                continue
            refused = self._refused.get(child.key)
            if refused is not None and refused[0] == child.digest:
                raise refused[1].with_traceback(None)
            drift = _drift(live, child, self._applied.get(child.key), covered)
            if drift is not None:
                now = trio.current_time()
                not_before = self.repairs.not_before(child.key, now)
                if not_before > now:
                    deferred.append(self._fighting(name, child, drift, not_before, now))
                    continue
            try:
                obj = await self._write(name, child, live)
            except Invalid as exc:
                self._refused[child.key] = (child.digest, exc)
                raise
            except _NotOurs as exc:
                taken.append(str(exc))
                continue
            self._refused.pop(child.key, None)
            self._deferred.pop(child.key, None)
            self.live.put(child.resource, obj)
            self._applied[child.key] = child.digest
            what = f"{child.resource.kind} {self.config.apps_namespace}/{child.name}"
            if drift is not None:
                # Recorded only once made: a refused write (the namespace terminating,
                # a 5xx) is a failed write with its own backoff, not a fight.
                self.repairs.record(child.key, trio.current_time())
                repaired.append(f"{what} ({drift})")
                self.metrics.fanout_applies.labels(self.kind.kind, "repaired").inc()
                self.metrics.fanout_drift_repairs.labels(self.kind.kind).inc()
                self.log.info("drift repaired", name=name, resource=str(child.resource),
                               child=child.name, drift=drift)
            else:
                applied.append(what)
                self.metrics.fanout_applies.labels(self.kind.kind, "applied").inc()
                self.log.info("child applied", name=name, resource=str(child.resource),
                               child=child.name)
        wanted = {child.key for child in desired}
        for key in sorted(self.live.of_parent(name) - wanted):
            live = self.live.get(key)
            if terminating(live):
                continue  # deleted already, held by a finalizer
            owner = self.claimant(key)
            if owner is not None and owner != name:
                # Its lineage label was edited to name this parent; the parent that
                # wants it (by its name) puts the label back. Never delete it.
                self.queue.requeue(owner, 0.0)
                continue
            resource = self.kind.child_resource(key.plural)
            if not written_by_us(live or {}, self._managers):
                # Only what we wrote is deleted: our labels alone prove nothing (said once).
                if key not in self._unwritten_said:
                    self._unwritten_said.add(key)
                    self.log.warning("an object carries our labels but was never written by"
                                     " us; not deleted", name=name, resource=str(resource),
                                     child=key.name)
                continue
            await self.drain.write(self.client.delete, resource, self.config.apps_namespace,
                                   key.name)
            self.live.discard(key)
            self._applied.pop(key, None)
            self.metrics.fanout_applies.labels(self.kind.kind, "deleted").inc()
            self.log.info("child deleted", name=name, resource=str(resource), child=key.name)
        if parent is None or parent.metadata.deletion_timestamp is not None:
            self.reporter.forget(name)
            self._taken_said.pop(name, None)
            for memo in (self._applied, self._deferred):
                for key in [k for k in memo if k not in wanted and k.name == name]:
                    del memo[key]
            return  # gone, or going: its status no longer matters
        if repaired:
            await self.reporter.event(parent, "Normal", "DriftRepaired",
                                      "repaired " + ", ".join(repaired))
        if applied and self.config.applied_events:
            await self.reporter.event(parent, "Normal", "Applied",
                                      "applied " + ", ".join(applied))
        if taken:
            # Objects not ours hold names (or fields) we want: left, reported Conflict. Not
            # requeued: another installation's child enqueues this parent when it changes
            # or goes; any other object is looked at again on the next resync.
            message = "not written: " + "; ".join(taken)
            self.metrics.fanout_applies.labels(self.kind.kind, "conflict").inc()
            if self._taken_said.get(name) != taken:  # their status updates re-enqueue us
                self._taken_said[name] = taken
                self.log.warning("an object that is not ours has the name (or holds fields)"
                                 " this parent's child needs; left alone", name=name,
                                 children=taken)
            await self.reporter.event(parent, "Warning", "Conflict", message)
            await self.reporter.write(parent, desired, "False", "Conflict", message[:1024])
            return
        self._taken_said.pop(name, None)
        if deferred:
            # Not Applied: those children are missing or wrong until their repair.
            await self.reporter.write(parent, desired, "False", "RepairDeferred",
                                      "; ".join(deferred)[:1024])
            return
        noun = "object" if len(desired) == 1 else "objects"
        await self.reporter.write(parent, desired, "True", "Applied",
                                  f"{len(desired)} {noun} applied in {self.config.apps_namespace}")

    def _foreign_appliers(self, obj: Obj) -> list[str]:
        """Managers not ours that applied to ``obj`` (declared owners of fields)."""
        return sorted(m for m, ops in managers_of(obj).items()
                      if m not in self._managers and "Apply" in ops)

    def _ours(self, live: Obj, parent: str) -> bool:
        return ours_to_write(live, lineage_key=self.kind.lineage_key, parent=parent,
                             installation=self.config.installation_label, managers=self._managers)

    async def _write(self, parent: str, child: Desired, live: Obj | None) -> Obj:
        """Create ``child`` when absent, else apply it to what is ours.

        When to force: :func:`~supervisor.fanout.ownership.conflict_managers`.

        Raises :class:`_NotOurs` when the object or one of its fields belongs to
        someone else: nothing is written then.
        """
        namespace = self.config.apps_namespace
        manager = self.config.field_manager
        if live is None:
            found: Obj | None = None
            # Twice: an object that refused our create may be gone when we look (deleted
            # meanwhile), and nothing is in the way of creating it again at once.
            for _ in range(2):
                try:
                    return await self.drain.write(
                        self.client.create_object, child.resource, namespace, child.body,
                        field_manager=manager)
                except Conflict as exc:
                    if exc.reason != "AlreadyExists":
                        raise
                found = await self.client.find(child.resource, namespace, child.name)
                if found is not None:
                    break
            if found is None:  # created and deleted by someone else, twice: the backoff's
                raise Conflict(409, "AlreadyExists",
                               f"{child.resource.kind} {namespace}/{child.name} refused our"
                               " create twice and was gone each time we looked")
            if not self._ours(found, parent):
                raise _NotOurs(describe(found, child.resource.kind, namespace,
                                        self.kind.lineage_key))
            live = found
        if created_by_update(live, self._managers):
            await self._fold_created(child, namespace)

        async def apply(force: bool) -> Obj:
            return await self.drain.write(self.client.apply, child.resource, namespace,
                                          child.name, child.body, field_manager=manager,
                                          force=force)

        try:
            # Forced at once when no manager but ours ever applied to it (an edit by an
            # update is drift): one write, not a refused apply, a read and the forced one.
            return await apply(not self._foreign_appliers(live))
        except Conflict as exc:
            managers = conflict_managers(exc)
            if not managers:
                raise
            foreign = managers - self._managers
        if foreign:
            # A manager that applied the field declared it its own: refused. One that
            # updated it (kubectl edit, scale, patch) edited a child of ours: drift.
            current = await self.client.find(child.resource, namespace, child.name)
            declared = sorted(set(self._foreign_appliers(current or {})) & foreign)
            if declared:
                raise _NotOurs(
                    f"{child.resource.kind} {namespace}/{child.name}: fields we set are"
                    f" applied by {', '.join(declared)} (a field manager that is not ours);"
                    " not forced")
        return await apply(True)

    async def _fold_created(self, child: Desired, namespace: str) -> None:
        """Hand the fields our create holds by an update to our apply entry.

        One JSON patch, guarded by the resourceVersion. Why:
        :func:`~supervisor.fanout.ownership.folded_managed_fields`.
        """
        current = await self.client.find(child.resource, namespace, child.name)
        now = kube_time()
        folded = folded_managed_fields(current or {}, self._managers,
                                       self.config.field_manager,
                                       child.resource.api_version, now)
        if current is None or folded is None:
            return
        version = (current.get("metadata") or {}).get("resourceVersion")
        try:
            await self.drain.write(
            self.client.request, "PATCH", child.resource.object_path(namespace, child.name),
                dict[str, Any], body=[{"op": "test", "path": "/metadata/resourceVersion",
                                       "value": version},
                                      {"op": "replace", "path": "/metadata/managedFields",
                                       "value": folded}],
                content_type="application/json-patch+json")
        except (Invalid, Conflict) as exc:
            # The test failed (a 422): written meanwhile. A race to retry, not a bad child.
            raise Conflict(409, "Conflict",
                           f"{child.resource.kind} {namespace}/{child.name} changed while"
                           " our create's managedFields entry was folded; retried") from exc

    def _fighting(self, name: str, child: Desired, drift: str, not_before: float,
                  now: float) -> str:
        """Someone keeps undoing our repairs of ``child``: repair it later, say so once.

        Returns what the parent's ``RepairDeferred`` status says about ``child``.
        """
        wait = not_before - now
        known = self._deferred.get(child.key)
        if known is None or known[0] != not_before:  # a new deferral
            known = (not_before, _wall_clock(wait))
            self._deferred[child.key] = known
        if child.key not in self._fights:
            self._fights.add(child.key)
            self.log.warning(
                "a child keeps drifting right after each repair (another controller, or"
                " another installation with a parent of the same name?); repairs slow down",
                name=name, resource=str(child.resource), child=child.name,
                delay_s=round(wait, 3))
        self.queue.requeue(name, wait)
        return (f"{child.resource.kind} {self.config.apps_namespace}/{child.name} was"
                f" {drift} again right after each of its last repairs (another controller,"
                f" or another installation with a parent of the same name?); its repair is"
                f" deferred, retried at {known[1]}")

    async def failed(self, name: str, parent: P, reason: str, message: str) -> None:
        """Report a failed reconcile on the parent: an Event and the ``Ready=False`` status."""
        event_reason = "Invalid" if reason == "Invalid" else "ApplyFailed"
        await self.reporter.event(parent, "Warning", event_reason, message)
        try:
            await self.reporter.write(parent, self.desired(parent), "False", reason,
                                      message[:1024])
        except KubeError as exc:
            self.log.warning("could not write the parent's status", name=name, error=str(exc))


class RepairLimiter:
    """How often one child may be repaired: a fight with another writer must not be a hot loop.

    Something that keeps changing a child (another controller, a second installation
    whose parent has the same name, a webhook rewriting a field we set) would meet a
    repair within milliseconds, every time, forever. :meth:`not_before`: the first
    ``burst`` repairs of one child within ``window_s`` go at once. Each further one
    waits 1 s, 2 s, 4 s ... after the previous, up to ``max_s``. The caller requeues
    the parent until then, logs the fight once, and reports ``RepairDeferred`` until
    the repair is made. The answer is a point in time (trio's clock). It stays the
    same while the repair waits, so its status is not rewritten by every reconcile.

    Only a repair *made* (its write succeeded) is recorded. A write refused or never
    answered changed nothing, so the next attempt is no fight: it has the engine's
    requeue backoff. :meth:`recent` counts one child's repairs in the window (tests).
    """

    def __init__(self, burst: int = 3, window_s: float = 60.0, max_s: float = 60.0) -> None:
        self.burst = burst
        self.window_s = window_s
        # The wait grows with the repairs inside the window, as the supervision
        # tree's restarts grow with the crashes inside its period; no jitter: the
        # status names the time (see not_before).
        self._wait = Backoff(1.0, max_s, jitter=(1.0, 1.0))
        self._times: dict[Hashable, list[float]] = {}

    def not_before(self, key: Hashable, now: float) -> float:
        """When ``key`` may be repaired again (``now`` or earlier: at once)."""
        times = [t for t in self._times.get(key, ()) if now - t < self.window_s]
        if times:
            self._times[key] = times
        else:
            self._times.pop(key, None)
        excess = len(times) - self.burst + 1
        return now if excess <= 0 else times[-1] + self._wait.after(excess - 1)

    def recent(self, key: Hashable, now: float) -> int:
        """How many repairs of ``key`` were recorded within ``window_s`` before ``now``."""
        return sum(1 for t in self._times.get(key, ()) if now - t < self.window_s)

    def record(self, key: Hashable, now: float) -> None:
        """A repair of ``key`` was made at ``now``."""
        self._times.setdefault(key, []).append(now)
        if len(self._times) > 10_000:  # bounded: forget children past the window
            self._times = {k: v for k, v in self._times.items()
                           if v and now - v[-1] < self.window_s}


class _NotOurs(Exception):
    """The object of a child's name, or one of its fields, is someone else's."""


def _wall_clock(seconds_from_now: float) -> str:
    """The wall-clock time ``seconds_from_now`` (RFC 3339 UTC, rounded up to the second)."""
    at = math.ceil(time.time() + seconds_from_now)
    return _dt.datetime.fromtimestamp(at, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _drift(live: Obj | None, child: Desired, applied_digest: str | None,
           covered: bool) -> str | None:
    """Why ``child`` is being rewritten although its desired state did not change, if so.

    ``covered``: its fields are ours already, but no managedFields entry of ours says
    so (reset by hand, or every field taken over by another manager's apply). Written
    again: else deleting its parent would leave it behind.
    """
    if live is None:
        return "deleted" if applied_digest == child.digest else None
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    if annotations.get(DIGEST_ANNOTATION) != child.digest:
        return None
    return "disowned" if covered else "edited"
