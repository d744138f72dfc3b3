"""The generic fan-out reconciler: one parent kind -> its children in the apps namespace.

One :class:`Reconciler` per kind runs as one supervised child
(:meth:`Reconciler.run`). What it guarantees:

- **Started before Kubernetes.** ``task_status.started()`` is called before
  the preflight: a watcher waiting for its namespace, RBAC or CRD has started
  (it is dormant, not failing), so ``READY=1`` never waits for Kubernetes.
- **Preflight, then watch.** The preflight (:mod:`supervisor.fanout.preflight`)
  lists the parent kind in the control namespace (which also detects a
  schema skew of the CRD) and each child resource in the apps namespace.
  Then an :class:`~supervisor.kube.watching.Informer` lists and watches the
  parents. A 403/404 or an undecodable list later sends the watcher back to
  its preflight (with a backoff, so a Role that can list but not watch
  cannot make it spin).
- **Desired state, written only when it changed.** Each parent maps to a set
  of :class:`~supervisor.kube.applying.Desired` children, named after the
  parent and labelled by :func:`supervisor.fanout.labels.labels`. A child is
  server-side applied only when its digest differs from what was last applied
  or observed; an unchanged resync writes nothing. A deleted parent's
  children, and children no longer desired (a ServiceDefinition whose
  ``port`` was removed loses its Service), are deleted.
- **Orphans** (children carrying our lineage label whose parent no longer
  exists) are swept after every (re)list and on the periodic resync, which
  also re-reads every child's digest so out-of-band deletions are repaired.
- **A work queue per kind**: keys (parent names) are deduplicated, one key is
  never reconciled by two workers at once, and ``workers`` bounds the
  concurrency. A failed reconcile is requeued with a per-key backoff (0.8 s
  doubling to 30 s, jittered; at least ``Retry-After`` on 429); a 409 is
  always requeued, never dropped. A 422 (the server refused our object) is
  not retried until the parent changes or the next resync.
- **Parent status**: the status subresource gets ``observedGeneration`` and a
  ``Ready`` condition (reasons ``Applied``, ``Conflict``, ``Invalid``,
  ``ApplyFailed``), written only when it changes.
- A parent that does not decode (schema skew) is logged at error with
  ``kind`` and ``error_class`` and skipped; its existing children are left
  alone (never swept: the parent exists, we just cannot read it).

Status and metrics: :class:`~supervisor.fanout.status.FanoutStatus` (``state``
preflight|watching, ``last_error_class``, ``objects``), and
``fanout_applies{kind,result}``, ``fanout_objects{kind}``,
``fanout_watch_restarts{kind}``, ``fanout_preflight_failures{kind,error_class}``.
"""

from __future__ import annotations

import datetime as _dt
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import trio

from supervisor import reasons
from supervisor.backoff import Backoff
from supervisor.config import KubernetesConfig
from supervisor.fanout.labels import lineage_selector
from supervisor.fanout.preflight import CRDS_FIX, await_watchable, classify_watch_error
from supervisor.fanout.status import FanoutStatus
from supervisor.kube.applying import ChildKey, Desired, apply_desired, digest_of
from supervisor.kube.client import KubeClient
from supervisor.kube.errors import (
    Conflict,
    DecodeError,
    Invalid,
    KubeError,
    NotFound,
    TooManyRequests,
)
from supervisor.kube.models import (
    KindSpec,
    ObjectMeta,
    ParentStatus,
    PartialObject,
    Resource,
)
from supervisor.kube.watching import Informer, WatchTuning
from supervisor.logs import get_logger
from supervisor.telemetry import Metrics

__all__ = ["FanoutKind", "FanoutTuning", "Parent", "Reconciler", "WorkQueue"]

log = get_logger("fanout")


class Parent(Protocol):
    """What the engine reads of any parent Struct."""

    @property
    def metadata(self) -> ObjectMeta: ...

    @property
    def status(self) -> ParentStatus: ...


P = TypeVar("P", bound=Parent)


@dataclass(frozen=True)
class FanoutKind(Generic[P]):
    """Everything kind-specific: the parent resource and type, and its children."""

    kind: str
    resource: Resource
    parent_type: type[P]
    lineage_key: str
    child_resources: tuple[Resource, ...]
    desired: Callable[[P, str], list[Desired]]  # (parent, apps namespace) -> children


@dataclass(frozen=True)
class FanoutTuning:
    """Timings and bounds; the defaults suit production, tests shrink them."""

    watch: WatchTuning = field(default_factory=WatchTuning)
    workers: int = 4
    resync_s: float = 300.0
    requeue_initial_s: float = 0.8
    requeue_max_s: float = 30.0
    page_size: int = 500


class WorkQueue:
    """Deduplicating keys, one worker per key at a time (client-go's workqueue, in small).

    A key added while queued is a no-op; added while being processed, it is
    processed once more after :meth:`done`.
    """

    def __init__(self) -> None:
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._dirty: set[str] = set()
        self._delayed: set[str] = set()
        self._lot = trio.lowlevel.ParkingLot()
        self._idle_lot = trio.lowlevel.ParkingLot()

    def add(self, key: str) -> None:
        if key in self._queued:
            return
        if key in self._active:
            self._dirty.add(key)
            return
        self._queued.add(key)
        self._queue.append(key)
        self._lot.unpark()

    async def add_after(self, key: str, delay_s: float) -> None:
        """Add ``key`` after ``delay_s`` (run it in a nursery); one pending delay per key."""
        if key in self._delayed:
            return
        self._delayed.add(key)
        try:
            await trio.sleep(delay_s)
        finally:
            self._delayed.discard(key)
        self.add(key)

    async def get(self) -> str:
        while not self._queue:
            await self._lot.park()
        key = self._queue.popleft()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: str) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)
        if self.idle():
            self._idle_lot.unpark_all()

    async def wait_idle(self) -> None:
        """Return once nothing is queued, processing, or waiting to be requeued."""
        while not self.idle():
            await self._idle_lot.park()

    def idle(self) -> bool:
        """Nothing queued, processing, or waiting to be requeued."""
        return not (self._queue or self._active or self._delayed)

    def __len__(self) -> int:
        return len(self._queue)


def _now_rfc3339() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class _StatusWant:
    generation: int
    status: str
    reason: str
    message: str


class Reconciler(Generic[P]):
    """Watches one parent kind and keeps its children converged (see the module doc)."""

    def __init__(
        self,
        client: KubeClient,
        kind: FanoutKind[P],
        config: KubernetesConfig,
        metrics: Metrics,
        status: FanoutStatus,
        tuning: FanoutTuning | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.kind = kind
        self.config = config
        self.metrics = metrics
        self.status = status
        self.tuning = tuning or FanoutTuning()
        self._rng = rng or random.Random()
        self.queue = WorkQueue()
        self.parents: dict[str, P] = {}
        self.skewed: set[str] = set()
        # Per parent: the digest of each child as last applied or observed.
        self.known: dict[str, dict[ChildKey, str]] = {}
        # The status we last wrote, with the parent's resourceVersion at that time.
        self._status_written: dict[str, tuple[str, _StatusWant]] = {}
        self._failures: dict[str, int] = {}
        # Children the server refused (422), by digest: not resent until they change
        # or the next resync, so a bad spec does not loop on its own status updates.
        self._refused: dict[ChildKey, tuple[str, Invalid]] = {}
        self._resync_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._by_plural = {res.plural: res for res in kind.child_resources}
        self.resyncs = 0
        self.reconciles = 0
        self.synced = trio.Event()  # set after the first list and resync
        self.informer: Informer[P] | None = None
        self._log = log.bind(kind=kind.kind)

    # -- the child --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. Reports started at once, before any Kubernetes request."""
        self.status.state = "preflight"
        task_status.started()
        back_off = Backoff(self.tuning.requeue_initial_s, self.tuning.requeue_max_s, self._rng)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for _ in range(max(1, self.tuning.workers)):
                nursery.start_soon(self._worker)
            nursery.start_soon(self._resync_loop)
            while True:
                await self._preflight()
                self.status.state = "watching"
                self.status.last_error_class = reasons.SCHEMA_SKEW if self.skewed else None
                self._log.info("fan-out watching", namespace=self.config.control_namespace)
                informer = Informer(
                    self.client, self.kind.resource, self.kind.parent_type,
                    self.config.control_namespace, self,
                    name_of=lambda parent: parent.metadata.name,
                    tuning=self.tuning.watch, on_restart=self._on_restart, rng=self._rng,
                )
                self.informer = informer
                try:
                    await informer.run()
                except KubeError as exc:
                    if informer.watches_with_events:
                        back_off.reset()
                    delay = back_off.next()
                    self._log.warning("fan-out watch lost; back to preflight",
                                      error=str(exc), delay_s=round(delay, 3))
                    self.metrics.fanout_watch_restarts.labels(self.kind.kind).inc()
                    self.status.state = "preflight"
                    self.status.last_error_class = classify_watch_error(exc)
                    await trio.sleep(delay)

    async def _preflight(self) -> None:
        targets: list[tuple[KindSpec[Any], str]] = [
            (KindSpec(self.kind.resource, self.kind.parent_type), self.config.control_namespace)
        ]
        targets += [
            (KindSpec(res, PartialObject), self.config.apps_namespace)
            for res in self.kind.child_resources
        ]
        for spec, namespace in targets:
            await await_watchable(
                self.client, spec, namespace, retry_s=self.config.preflight_retry_s,
                kind=self.kind.kind, status=self.status, metrics=self.metrics,
            )

    def _on_restart(self, why: str) -> None:
        self.metrics.fanout_watch_restarts.labels(self.kind.kind).inc()

    # -- the informer's handler ---------------------------------------------------

    def _count(self) -> None:
        # Not len(parents | skewed): that is O(n) per event; skewed is almost always empty.
        count = len(self.parents) + sum(1 for name in self.skewed if name not in self.parents)
        self.status.objects = count
        self.metrics.fanout_objects.labels(self.kind.kind).set(count)
        if not self.skewed and self.status.last_error_class == reasons.SCHEMA_SKEW:
            self.status.last_error_class = None

    async def on_list(self, items: Mapping[str, P], skewed: set[str]) -> None:
        self.parents = dict(items)
        self.skewed = set(skewed)
        # A relist may follow a restored API server whose resourceVersions repeat
        # for other content: forget which (name, RV) statuses were written.
        self._status_written.clear()
        self._count()
        await self.resync()
        self.synced.set()

    def on_upsert(self, obj: P, name: str) -> None:
        self.parents[name] = obj
        self.skewed.discard(name)
        self._count()
        self.queue.add(name)

    def on_delete(self, name: str) -> None:
        self.parents.pop(name, None)
        self.skewed.discard(name)
        self._count()
        self.queue.add(name)

    def on_skewed(self, name: str, error: DecodeError) -> None:
        if name:
            self.skewed.add(name)
        self._count()
        self.status.last_error_class = reasons.SCHEMA_SKEW  # after _count, which may clear it
        self._log.error(
            "fan-out object failed to decode and is skipped (schema skew: the installed CRD"
            f" schema differs from this build's); apply `{CRDS_FIX}`",
            error_class=reasons.SCHEMA_SKEW, name=name or None, error=str(error),
            fix=CRDS_FIX,
        )

    # -- resync and orphans -------------------------------------------------------

    async def _resync_loop(self) -> None:
        while True:
            await trio.sleep(self.tuning.resync_s)
            if not self.synced.is_set() or self.status.state != "watching":
                continue
            try:
                await self.resync()
            except KubeError as exc:
                self._log.warning("periodic resync failed; next one will retry", error=str(exc))

    async def _list_children(self, resource: Resource) -> list[PartialObject]:
        out: list[PartialObject] = []
        token: str | None = None
        while True:
            page = await self.client.list(
                resource, self.config.apps_namespace, PartialObject,
                limit=self.tuning.page_size, continue_token=token,
                label_selector=lineage_selector(self.kind.lineage_key),
            )
            out += page.items
            token = page.metadata.continue_
            if not token:
                return out

    async def resync(self) -> None:
        """Re-read every child, sweep orphans, and enqueue every parent.

        The children's digests replace what we remembered, so a child deleted
        or re-labelled behind our back is re-applied, and nothing unchanged is
        written.
        """
        async with self._resync_lock:
            observed: dict[str, dict[ChildKey, str]] = {}
            orphans: list[tuple[Resource, str, str]] = []
            for resource in self.kind.child_resources:
                for child in await self._list_children(resource):
                    parent = child.metadata.labels.get(self.kind.lineage_key, "")
                    if parent in self.parents or parent in self.skewed:
                        key = ChildKey(resource.plural, child.metadata.name)
                        observed.setdefault(parent, {})[key] = digest_of(child) or ""
                    else:
                        orphans.append((resource, child.metadata.name, parent))
            self.known = observed
            self._refused.clear()
            for resource, name, parent in orphans:
                try:
                    await self.client.delete(resource, self.config.apps_namespace, name)
                except KubeError as exc:
                    self.metrics.fanout_applies.labels(self.kind.kind, "error").inc()
                    self._log.warning("orphan sweep failed; the next resync retries",
                                      resource=str(resource), name=name, error=str(exc))
                    continue
                self.metrics.fanout_applies.labels(self.kind.kind, "deleted").inc()
                self._log.info("orphan swept", resource=str(resource), name=name,
                               parent=parent)
            self.resyncs += 1
            for name in sorted(self.parents):
                self.queue.add(name)

    # -- workers ------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            name = await self.queue.get()
            try:
                await self._reconcile_guarded(name)
            finally:
                self.queue.done(name)

    def _requeue(self, name: str, exc: KubeError) -> float:
        failures = self._failures.get(name, 0)
        self._failures[name] = failures + 1
        nominal = min(self.tuning.requeue_max_s, self.tuning.requeue_initial_s * 2.0 ** failures)
        delay = nominal * self._rng.uniform(0.5, 1.0)
        if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
            delay = max(delay, exc.retry_after)
        assert self._nursery is not None
        self._nursery.start_soon(self.queue.add_after, name, delay)
        return delay

    async def _reconcile_guarded(self, name: str) -> None:
        try:
            await self.reconcile(name)
        except Conflict as exc:
            self.metrics.fanout_applies.labels(self.kind.kind, "conflict").inc()
            delay = self._requeue(name, exc)
            self._log.info("conflict writing a child; requeued", name=name, error=str(exc),
                           delay_s=round(delay, 3))
            await self._fail_status(name, "Conflict", str(exc))
        except Invalid as exc:
            self.metrics.fanout_applies.labels(self.kind.kind, "error").inc()
            self._log.warning("child refused by the API server; not retried until the parent"
                              " changes", name=name, error=str(exc))
            await self._fail_status(name, "Invalid", str(exc))
        except KubeError as exc:
            self.metrics.fanout_applies.labels(self.kind.kind, "error").inc()
            delay = self._requeue(name, exc)
            self._log.warning("reconcile failed; requeued", name=name, error=str(exc),
                              delay_s=round(delay, 3))
            await self._fail_status(name, "ApplyFailed", str(exc))
        else:
            self._failures.pop(name, None)

    async def reconcile(self, name: str) -> None:
        """Make ``name``'s children what its current parent wants (none when deleted)."""
        self.reconciles += 1
        if name in self.skewed:
            return  # unreadable parent: leave its children exactly as they are
        parent = self.parents.get(name)
        desired: list[Desired] = []
        if parent is not None and parent.metadata.deletion_timestamp is None:
            desired = self.kind.desired(parent, self.config.apps_namespace)
        known = self.known.setdefault(name, {})
        for child in desired:
            if known.get(child.key) == child.digest:
                self.metrics.fanout_applies.labels(self.kind.kind, "unchanged").inc()
                continue
            refused = self._refused.get(child.key)
            if refused is not None and refused[0] == child.digest:
                earlier = refused[1]
                raise Invalid(earlier.status, earlier.reason, earlier.message,
                              method=earlier.method, path=earlier.path)
            try:
                await apply_desired(self.client, self.config.apps_namespace, child,
                                    field_manager=self.config.field_manager)
            except Invalid as exc:
                self._refused[child.key] = (child.digest, exc)
                raise
            self._refused.pop(child.key, None)
            known[child.key] = child.digest
            self.metrics.fanout_applies.labels(self.kind.kind, "applied").inc()
            self._log.info("child applied", name=name, resource=str(child.resource),
                           child=child.name)
        wanted = {child.key for child in desired}
        for key in sorted(set(known) - wanted):
            resource = self._by_plural[key.plural]
            await self.client.delete(resource, self.config.apps_namespace, key.name)
            known.pop(key, None)
            self.metrics.fanout_applies.labels(self.kind.kind, "deleted").inc()
            self._log.info("child deleted", name=name, resource=str(resource), child=key.name)
        if not known:
            self.known.pop(name, None)
        if parent is None or parent.metadata.deletion_timestamp is not None:
            self._status_written.pop(name, None)
            return  # gone, or going: its status no longer matters
        noun = "object" if len(desired) == 1 else "objects"
        await self._write_status(
            parent, _StatusWant(parent.metadata.generation, "True", "Applied",
                                f"{len(desired)} {noun} applied in {self.config.apps_namespace}")
        )

    # -- parent status -------------------------------------------------------------

    async def _fail_status(self, name: str, reason: str, message: str) -> None:
        parent = self.parents.get(name)
        if parent is None or name in self.skewed:
            return
        want = _StatusWant(parent.metadata.generation, "False", reason, message[:1024])
        try:
            await self._write_status(parent, want)
        except KubeError as exc:
            self._log.warning("could not write the parent's status", name=name, error=str(exc))

    async def _write_status(self, parent: P, want: _StatusWant) -> None:
        meta = parent.metadata
        written = self._status_written.get(meta.name)
        if written is not None and written == (meta.resource_version, want):
            return  # written already; our own MODIFIED event has not arrived yet
        current = parent.status.condition("Ready")
        if (
            parent.status.observed_generation == want.generation
            and current is not None
            and (current.status, current.reason, current.message)
            == (want.status, want.reason, want.message)
        ):
            return
        transition = (
            current.last_transition_time
            if current is not None and current.status == want.status
            and current.last_transition_time
            else _now_rfc3339()
        )
        body = {
            "apiVersion": self.kind.resource.api_version,
            "kind": self.kind.resource.kind,
            "metadata": {"name": meta.name, "namespace": self.config.control_namespace},
            "status": {
                "observedGeneration": want.generation,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": want.status,
                        "reason": want.reason,
                        "message": want.message,
                        "lastTransitionTime": transition,
                        "observedGeneration": want.generation,
                    }
                ],
            },
        }
        try:
            await self.client.apply(
                self.kind.resource, self.config.control_namespace, meta.name, body,
                field_manager=self.config.field_manager, subresource="status",
            )
        except NotFound:
            return  # the parent was deleted meanwhile; its DELETED event follows
        self._status_written[meta.name] = (meta.resource_version, want)
