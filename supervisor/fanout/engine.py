"""The fan-out engine: :class:`FanoutEngine`, one parent kind to its children in the apps namespace.

Operators: docs/operations.md, "The fan-out controller"; docs/kubernetes.md.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic

import trio

from supervisor import reasons
from supervisor.backoff import Backoff
from supervisor.config import KubernetesConfig
from supervisor.fanout.childwrites import ChildWriter
from supervisor.fanout.drain import Drain
from supervisor.fanout.kind import FanoutKind, FanoutTuning, P, Parent, matters
from supervisor.fanout.labels import foreign_selector, lineage_selector
from supervisor.fanout.live import ForeignChildren, LiveChildren, ResourceHandler, child_name
from supervisor.fanout.parentstatus import ParentReporter
from supervisor.fanout.preflight import (
    CRDS_FIX,
    await_watchable,
    classify_watch_error,
    failure_class,
)
from supervisor.fanout.status import FanoutStatus
from supervisor.fanout.sweep import Sweeper
from supervisor.fanout.workqueue import WorkQueue
from supervisor.kube.client import KubeClient
from supervisor.kube.errors import Conflict, DecodeError, Invalid, KubeError, TooManyRequests
from supervisor.kube.watching import Informer
from supervisor.logs import get_logger
from supervisor.streak import Streak
from supervisor.telemetry import Metrics
from supervisor.wakeup import Wakeup

__all__ = ["FanoutEngine", "FanoutKind", "FanoutTuning", "Parent", "WorkQueue"]

log = get_logger("fanout")


class FanoutEngine(Generic[P]):
    """Watches one parent kind and its children and keeps them converged; one supervised child.

    After a preflight (:mod:`supervisor.fanout.preflight`), one
    :class:`~supervisor.kube.watching.Informer` lists and watches the parents in the
    control namespace. One per child resource watches this installation's children
    (by the managed-by, installation and lineage labels) into :class:`LiveChildren
    <supervisor.fanout.live.LiveChildren>`. One more per child resource watches other
    installations' children of this kind into :class:`ForeignChildren
    <supervisor.fanout.live.ForeignChildren>`, never ours to write. A 403/404 or an
    undecodable list from any of them sends the kind back to its preflight, with a
    backoff reset after a watch that delivered.

    A child's change or delete enqueues the parent its lineage label names. A parent's
    update enqueues it only when it :func:`~supervisor.fanout.kind.matters`: a status
    write does not. ``workers`` tasks take names from one
    :class:`~supervisor.fanout.workqueue.WorkQueue` and run :meth:`attempt` (the retry
    policy) around the :class:`~supervisor.fanout.childwrites.ChildWriter` reconcile. Orphans
    are swept after every parent (re)list and at each resync
    (:class:`~supervisor.fanout.sweep.Sweeper`).
    Writes run shielded: at shutdown none starts, and one in flight gets ``drain_s``
    (:class:`~supervisor.fanout.drain.Drain`). A parent that does not decode (schema
    skew) is logged at error, skipped and listed in the status; its children are left
    alone, never swept.
    """

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
        wakeup: Wakeup | None = None,
    ) -> None:
        self.client = client
        self.kind = kind
        self.config = config
        self.metrics = metrics
        self.status = status
        self.tuning = tuning or FanoutTuning()
        self.wakeup = wakeup
        self._rng = rng or random.Random()
        self.queue = WorkQueue()
        metrics.fanout_queue_depth.labels(kind.kind).set_function(lambda: len(self.queue))
        self.parents: dict[str, P] = {}
        self.skewed: set[str] = set()
        self.live = LiveChildren(kind.child_resources, kind.lineage_key, self.queue.add)
        self.foreign = ForeignChildren(kind.child_resources, kind.lineage_key, self.queue.add)
        self.drain = Drain(self.tuning.drain_s)
        self.reporter = ParentReporter(client, kind.resource, config, self.live, self.drain)
        self._log = log.bind(kind=kind.kind)
        self.writer: ChildWriter[P] = ChildWriter(
            client=client, kind=kind, config=config, metrics=metrics, log=self._log,
            parents=self.parents, skewed=self.skewed, live=self.live, foreign=self.foreign,
            queue=self.queue, drain=self.drain, reporter=self.reporter)
        self.sweeper = Sweeper(client, kind, config, self.live, self.drain, metrics,
                               self.writer.claimant)
        # The retry policy (:meth:`attempt`): failed attempts of each key since its last
        # success, and its streak of failures with its latest failure's class (latest last).
        self._requeue_backoff = Backoff(self.tuning.requeue_initial_s,
                                        self.tuning.requeue_max_s, self._rng)
        self._failures: dict[str, int] = {}
        self._failing: dict[str, tuple[Streak, str]] = {}
        self._resync_lock = trio.Lock()
        self._installation = config.installation_label
        self._selector = lineage_selector(kind.lineage_key, self._installation)
        self.resyncs = 0
        self.reconciles = 0
        self.synced = trio.Event()  # set after the first list and resync
        self.informer: Informer[P] | None = None
        # While watching: each informer's watch open (True) or not, and its last failure's
        # class until it opens again. Empty outside _watch_all (the preflight's own).
        self._open: dict[int, bool] = {}
        self._watch_errors: dict[int, str] = {}
        # "fan-out watching" said since the last failure: a watch re-opened after a
        # normal end (timeoutSeconds, every few minutes) is not news.
        self._said_watching = False

    # -- the child --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. Reports started at once, before any Kubernetes request.

        A kind waiting for its namespace, RBAC or CRD is dormant, not failing: ``READY=1``
        never waits for Kubernetes.
        """
        self.status.state = "preflight"
        task_status.started()
        watch = self.tuning.watch
        back_off = Backoff(watch.backoff_initial_s, watch.backoff_max_s, self._rng)
        async with trio.open_nursery() as nursery:
            self.queue.bind(nursery)
            nursery.start_soon(self.drain.guard)
            for _ in range(max(1, self.tuning.workers)):
                nursery.start_soon(self._worker)
            nursery.start_soon(self._resync_loop)
            while True:
                await self._preflight()
                self.status.last_error_class = reasons.SCHEMA_SKEW if self.skewed else None
                exc, productive = await self._watch_all()
                # Nothing is compared against children nobody watches any more: the
                # workers wait until the next watch has listed them again.
                self.live.clear()
                self.foreign.clear()
                if productive:
                    back_off.reset()
                delay = back_off.next()
                self._log.warning("fan-out watch lost; back to preflight",
                                  error=str(exc), delay_s=round(delay, 3))
                self.metrics.fanout_watch_restarts.labels(self.kind.kind).inc()
                self.status.state = "preflight"
                self.status.last_error_class = classify_watch_error(exc)
                await trio.sleep(delay)

    async def _preflight(self) -> None:
        targets = [(self.kind.resource, self.config.control_namespace, False)]
        targets += [(res, self.config.apps_namespace, True) for res in self.kind.child_resources]
        for resource, namespace, child in targets:
            await await_watchable(
                self.client, resource, namespace, retry_s=self.config.preflight_retry_s,
                kind=self.kind.kind, status=self.status, metrics=self.metrics,
                wakeup=self.wakeup, is_served=self.client.serves if child else None,
            )

    async def _watch_all(self) -> tuple[KubeError, bool]:
        """Run the parent informer and one informer per child resource until one fails.

        Returns the failure (a preflight matter) and whether any stream delivered.
        """
        self.live.clear()
        self.foreign.clear()
        failures: list[KubeError] = []
        restarted = self.metrics.fanout_watch_restarts.labels(self.kind.kind).inc
        common: dict[str, Any] = {"tuning": self.tuning.watch, "on_restart": restarted,
                                  "rng": self._rng}
        parents: Informer[P] = Informer(
            self.client, self.kind.resource, self.kind.parent_type,
            self.config.control_namespace, self, name_of=lambda parent: parent.metadata.name,
            **common, **self._watch_hooks(0))
        self.informer = parents
        foreign = foreign_selector(self.kind.lineage_key, self._installation)
        watches = [(res, index, selector) for res in self.kind.child_resources
                   for index, selector in ((self.live, self._selector), (self.foreign, foreign))]
        informers: list[Informer[Any]] = [parents] + [
            Informer(self.client, res, dict[str, Any], self.config.apps_namespace,
                     ResourceHandler(index, res), name_of=child_name, label_selector=selector,
                     **common, **self._watch_hooks(1 + key))
            for key, (res, index, selector) in enumerate(watches)]
        self._open = dict.fromkeys(range(len(informers)), False)  # and no errors: see finally
        self._said_watching = False
        try:
            async with trio.open_nursery() as nursery:

                async def guard(informer: Informer[Any]) -> None:
                    try:
                        await informer.run()
                    except KubeError as exc:
                        failures.append(exc)
                        nursery.cancel_scope.cancel()

                for informer in [*informers[1:], parents]:
                    nursery.start_soon(guard, informer)
        finally:
            self._open = {}
            self._watch_errors.clear()
        return failures[0], any(informer.watches_with_events for informer in informers)

    def _watch_hooks(self, key: int) -> dict[str, Any]:
        def opened(now_open: bool) -> None:
            # Ended (normally too: timeoutSeconds): none open until the next one's headers.
            if key in self._open:
                self._open[key] = now_open
                if now_open:
                    self._watch_errors.pop(key, None)
                self._show()

        def on_failure(exc: KubeError) -> None:
            # After its watch closed (or a list that never opened one).
            error_class = failure_class(exc)
            self.metrics.fanout_errors.labels(self.kind.kind, error_class).inc()
            self._said_watching = False
            self._watch_errors.pop(key, None)
            self._watch_errors[key] = error_class  # the latest last
            self._show()

        return {"on_open": lambda: opened(True), "on_close": lambda: opened(False),
                "on_failure": on_failure}

    def _show(self) -> None:
        """``state`` and ``last_error_class`` while watching.

        ``watching`` while every watch of the kind is open (its headers came); ``fan-out
        watching`` is logged again only after a failure. Between two watches (one ended
        at ``timeoutSeconds``, a relist) it is ``preflight`` with no error class. A list
        or watch being retried shows its failure's class
        (:func:`~supervisor.fanout.preflight.failure_class`) until it is open again. So
        do child writes while any parent's writes keep failing. Every failure counts in
        ``fanout_errors{kind,class}``.
        """
        if not self._open:
            return  # in the preflight, which says so itself
        watching = all(self._open.values())
        if watching and not self._said_watching:
            self._said_watching = True
            self._log.info("fan-out watching", namespace=self.config.control_namespace,
                           installation=self._installation)
        self.status.state = "watching" if watching else "preflight"
        self.status.last_error_class = (
            next(reversed(self._watch_errors.values()), None) or self.failing_class
            or (reasons.SCHEMA_SKEW if self.skewed else None))

    # -- the parent informer's handler ----------------------------------------------

    def _count(self) -> None:
        # Not len(parents | skewed): that is O(n) per event; skewed is almost always empty.
        count = len(self.parents) + sum(1 for name in self.skewed if name not in self.parents)
        self.status.objects = count
        self.status.skewed = sorted(self.skewed)[:20]
        self.metrics.fanout_objects.labels(self.kind.kind).set(count)
        if not self.skewed and self.status.last_error_class == reasons.SCHEMA_SKEW:
            self.status.last_error_class = None
            self._show()

    async def on_list(self, items: Mapping[str, P], skewed: set[str]) -> None:
        # In place: the writer reads these very objects.
        self.parents.clear()
        self.parents.update(items)
        self.skewed.clear()
        self.skewed.update(skewed)
        # A relist may follow a restored API server whose resourceVersions repeat
        # for other content: forget which (name, RV) statuses were written.
        self.reporter.forget()
        self._count()
        await self.resync()
        self.synced.set()

    def on_upsert(self, obj: P, name: str) -> None:
        old = self.parents.get(name)
        self.parents[name] = obj
        was_skewed = name in self.skewed
        self.skewed.discard(name)
        self._count()
        if old is not None and not was_skewed and not matters(old, obj):
            return  # a status-only update (ours, usually): nothing to reconcile
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
        path = getattr(error, "path", "") or None
        self._log.error(
            "fan-out object failed to decode and is skipped", detail=
            f"fan-out object {name or '(unnamed)'} failed to decode and is skipped (schema"
            f" skew: the installed CRD schema differs from this build's, or the object was"
            f" stored under an older one); fix the object or apply `{CRDS_FIX}`",
            error_class=reasons.SCHEMA_SKEW, name=name or None, path=path,
            error=str(error), fix=CRDS_FIX,
        )

    # -- resync and orphans -------------------------------------------------------

    async def _resync_loop(self) -> None:
        period = self.tuning.resync_s or self.config.resync_s
        while True:
            await trio.sleep(period)
            if not self.synced.is_set() or self.status.state != "watching":
                continue
            try:
                await self.resync()
            except KubeError as exc:
                self._log.warning("periodic resync failed; next one will retry", error=str(exc))

    async def resync(self) -> None:
        """Sweep orphans (behind the sweep guard) and enqueue every parent.

        After every parent (re)list, and every ``[kubernetes].resync_s``. The children
        are the watched cache (always current): a resync reads and writes nothing for
        parents whose children are as desired.
        """
        await self._sweep(self.sweeper.sweep)
        self.writer.forget_refusals()
        self.resyncs += 1
        for name in sorted(self.parents):
            self.queue.add(name)

    async def _sweep(self, sweep: Callable[[set[str]], Awaitable[None]]) -> None:
        await self._children_synced()
        async with self._resync_lock:
            await sweep(set(self.parents) | self.skewed)

    # -- workers ------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            name = await self.queue.get()
            try:
                # Never compare against a cache that has not been listed yet.
                await self._children_synced()
                listed = name in self.parents
                await self.attempt(name)
                if listed and name not in self.parents and not self.queue.pending(name):
                    # A relist dropped the parent while its children were written.
                    await self._sweep(self.sweeper.sweep_late)
            finally:
                self.queue.done(name)

    async def _children_synced(self) -> None:
        await self.live.wait_synced()
        await self.foreign.wait_synced()

    async def reconcile(self, name: str) -> None:
        """Make ``name``'s children what its current parent wants (none when deleted)."""
        self.reconciles += 1
        if name in self.skewed:
            return  # unreadable parent: leave its children exactly as they are
        await self.writer.reconcile(name, self.parents.get(name))

    async def _failed(self, name: str, reason: str, message: str) -> None:
        parent = self.parents.get(name)
        if parent is None or name in self.skewed:
            return
        await self.writer.failed(name, parent, reason, message)

    # -- the retry policy -----------------------------------------------------------

    @property
    def failing_class(self) -> str | None:
        return next((error_class for _, error_class in reversed(self._failing.values())), None)

    def _streak_failed(self, name: str, exc: KubeError, delay: float) -> None:
        error_class = failure_class(exc)
        self.metrics.fanout_errors.labels(self.kind.kind, error_class).inc()
        failing = self._failing.pop(name, None)
        streak = failing[0] if failing is not None else Streak(
            self._log, began="reconcile failed; requeued", ended="reconcile succeeds again",
            count_as="failures")
        streak.failed(name=name, error=str(exc), error_class=error_class,
                      delay_s=round(delay, 3))
        self._failing[name] = (streak, error_class)
        self._show()

    def _streak_ended(self, name: str, *, recovered: bool) -> None:
        if name not in self._failing:
            return
        streak, _ = self._failing.pop(name)
        if recovered:
            streak.recovered(name=name)
        self._show()

    def requeue(self, name: str, exc: KubeError, cause: str) -> float:
        """Requeue ``name`` after its next backoff delay (returned, in seconds)."""
        failures = self._failures.get(name, 0)
        self._failures[name] = failures + 1
        delay = self._requeue_backoff.after(failures, at_least=exc.retry_after)
        self.metrics.fanout_requeues.labels(self.kind.kind, cause).inc()
        self.queue.requeue(name, delay)
        return delay

    async def attempt(self, name: str) -> None:
        """Reconcile ``name`` once; a KubeError is requeued or reported, never raised.

        Anything else, cancellation included, propagates. Success resets the key's
        backoff. A 409 (:class:`~supervisor.kube.errors.Conflict`) is requeued, never
        dropped, logged at info. A 422 (:class:`~supervisor.kube.errors.Invalid`) is not
        requeued: the parent's change or the next resync brings it back. Any other
        (a 403, a 5xx, a timeout, a 429) is requeued and counted in
        ``fanout_errors{kind,class}``. It is logged once per streak of that parent's
        failures (``reconcile failed; requeued``); its end at info (``reconcile
        succeeds again``, ``failures``, ``after_s``). Every attempt counts in
        ``fanout_applies``, ``fanout_requeues`` (``conflict``, ``throttled``, ``error``)
        and ``fanout_reconcile_duration_seconds``.

        A requeue waits a per-key backoff from the first retry on: ``requeue_initial_s``
        doubling to ``requeue_max_s`` (0.8 s to 30 s by default), jittered down to half.
        On a 429, at least its ``Retry-After``. :attr:`failing_class` is the latest
        failure's class while any parent's streak lasts; the status is shown again at
        each change.
        """
        started = trio.current_time()
        result = "success"
        try:
            await self.reconcile(name)
        except Conflict as exc:
            result = "conflict"
            self.metrics.fanout_applies.labels(self.kind.kind, "conflict").inc()
            delay = self.requeue(name, exc, "conflict")
            self._log.info("conflict writing a child; requeued", name=name, error=str(exc),
                           delay_s=round(delay, 3))
            await self._failed(name, "Conflict", str(exc))
        except Invalid as exc:
            result = "invalid"
            self.metrics.fanout_applies.labels(self.kind.kind, "error").inc()
            self._log.warning("child refused by the API server; not retried until the parent"
                              " changes", name=name, error=str(exc))
            self._streak_ended(name, recovered=False)  # another failure now, said above
            await self._failed(name, "Invalid", str(exc))
        except KubeError as exc:
            result = "error"
            self.metrics.fanout_applies.labels(self.kind.kind, "error").inc()
            cause = "throttled" if isinstance(exc, TooManyRequests) else "error"
            delay = self.requeue(name, exc, cause)
            self._streak_failed(name, exc, delay)
            await self._failed(name, "ApplyFailed", str(exc))
        else:
            self._failures.pop(name, None)
            self._streak_ended(name, recovered=True)
        finally:
            self.metrics.fanout_reconcile_duration.labels(self.kind.kind, result).observe(
                trio.current_time() - started)
