"""The convergence loop: observe, hydrate, compile, publish, or say exactly why not.

One task per replica keeps the active snapshot equal to the control plane's
desired revision:

1. **observe**: the cheap desired-revision read. It runs even when converged,
   because it is both the change detector and the liveness check.
2. **hydrate**: one consistent read of the complete desired revision. A
   revision published between the two reads is simply the one we converge to.
3. **compile**: decode, validate, project, resolve secrets, build an immutable
   :class:`~supervisor.revision.snapshot.Snapshot`.
4. **publish**: one atomic swap in :class:`~supervisor.sinks.state.ActiveState`,
   then the side sinks (snapshot file, last-known-good cache).

Every failure happens before step 4 touches anything, so a refused candidate
cannot half-apply: "the previous snapshot keeps serving" follows from the
control flow, not from a cleanup path. Side-sink failures after the swap are
logged once per failure streak and counted; they never stop serving.

Polling is the correctness mechanism; the :class:`ChangeSignal` (LISTEN,
SIGHUP, a LISTEN reconnect) only shortens the wait. A failing attempt replaces
the poll interval with the backoff delay (``backoff_initial_s`` doubling to
``backoff_max_s``), reset on success, so an outage never becomes a hot loop.

Bootstrap (:meth:`Reconciler.bootstrap`) reaches a first servable snapshot or
raises :class:`~supervisor.errors.BootRefused` (exit 3). The signed
last-known-good cache answers exactly two failures: an unreachable control
plane, and a desired revision this build cannot read (``incompatible``, a
mixed-version rollout). Corruption, oversize, refused reads and uncompilable
revisions never fall back: cached state would hide damage an operator must fix.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from supervisor import reasons
from supervisor.controlplane.store import ControlPlaneError
from supervisor.convergence.backoff import Backoff
from supervisor.convergence.signal import ChangeSignal
from supervisor.convergence.status import RevisionStatus, Source
from supervisor.errors import BootRefused
from supervisor.events import EventBus
from supervisor.logs import get_logger
from supervisor.revision.errors import RevisionError
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics

if TYPE_CHECKING:
    from supervisor.controlplane.store import ControlPlaneStore
    from supervisor.revision.secrets import SecretResolver
    from supervisor.revision.snapshot import Snapshot
    from supervisor.sinks.file import SnapshotFile
    from supervisor.sinks.lkg import LastKnownGood

__all__ = ["Outcome", "OutcomeKind", "Reconciler"]

log = get_logger("convergence")

# Bodies above this (about 10,000 aliases, ~6 ms of compile) are compiled in a
# worker thread so the event loop (admin
# API, signals, watchdog) keeps answering during a large compile.
THREAD_COMPILE_BYTES = 1024 * 1024

# Wake-ups that already say desired state changed: hydrate without observing first.
FAST_TRIGGERS = frozenset({"notify"})


class OutcomeKind(enum.Enum):
    PUBLISHED = "published"
    CONVERGED = "converged"
    EMPTY = "empty"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    revision: int | None = None
    generation: int | None = None
    reason: str | None = None
    detail: str | None = None
    took_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.kind is OutcomeKind.REJECTED


class _Streak:
    """Log a side-sink failure once per failure streak, and its recovery once."""

    def __init__(self, sink: str, metrics: Metrics) -> None:
        self.sink = sink
        self.metrics = metrics
        self.failing = False

    def failed(self, exc: BaseException, **context: object) -> None:
        self.metrics.sink_write_failures.labels(self.sink).inc()
        if not self.failing:
            log.warning("sink write failed; still serving", sink=self.sink, error=str(exc),
                        **context)
        self.failing = True

    def ok(self) -> None:
        if self.failing:
            log.info("sink write recovered", sink=self.sink)
        self.failing = False


def _failure_fields(exc: ControlPlaneError | RevisionError) -> tuple[str, int | None, str]:
    """(reason label, revision or None, detail) of a store or compile failure."""
    if isinstance(exc, RevisionError):
        return exc.reason, exc.revision, exc.detail
    return exc.reason, exc.revision, str(exc)


class Reconciler:
    def __init__(
        self,
        store: ControlPlaneStore,
        *,
        state: ActiveState,
        status: RevisionStatus,
        metrics: Metrics,
        events: EventBus,
        signal: ChangeSignal,
        poll_interval_s: float,
        backoff_initial_s: float,
        backoff_max_s: float,
        resolver: SecretResolver | None = None,
        cache: LastKnownGood | None = None,
        snapshot_file: SnapshotFile | None = None,
        on_status: Callable[[str], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.state = state
        self.status = status
        self.metrics = metrics
        self.events = events
        self.signal = signal
        self.poll_interval_s = poll_interval_s
        self.backoff = Backoff(backoff_initial_s, backoff_max_s, rng)
        self.resolver = resolver
        self.cache = cache
        self.snapshot_file = snapshot_file
        self._on_status = on_status or (lambda _text: None)
        self._file_streak = _Streak("snapshot_file", metrics)
        self._cache_streak = _Streak("cache", metrics)
        self.attempts = 0

    # -- one attempt -----------------------------------------------------------

    async def _compile(self, body: bytes, revision: int, generation: int) -> Snapshot:
        from supervisor.revision.compile import compile_revision

        def run() -> Snapshot:
            return compile_revision(
                body, revision=revision, generation=generation, resolver=self.resolver
            )

        if len(body) > THREAD_COMPILE_BYTES:
            return await trio.to_thread.run_sync(run, abandon_on_cancel=True)
        return run()

    async def _attempt(self, *, observe: bool = True) -> Outcome:
        """Observe, hydrate, compile, publish. Raises store and revision errors.

        ``observe=False`` skips the cheap read and hydrates straight away: a
        notification already says desired state changed, and hydrate reads the
        desired pointer itself, so the separate round trip would only add latency.
        """
        start = trio.current_time()
        desired: int | None = None
        if observe:
            try:
                desired = await self.store.desired()
            except ControlPlaneError:
                self._set_reachable(False)
                raise
            self._set_reachable(True)
            self.status.observed(desired)
            self.metrics.desired_revision.set(desired or 0)
            if desired is None:
                return Outcome(OutcomeKind.EMPTY)
            if desired == self.status.active and self.status.source == "control_plane":
                return Outcome(OutcomeKind.CONVERGED, revision=desired)
        try:
            loaded = await self.store.hydrate()
        except ControlPlaneError as exc:
            if not observe and exc.retryable:
                self._set_reachable(False)
            raise
        if not observe:
            self._set_reachable(True)
        if loaded is None:
            if not observe:
                self.status.observed(None)
            return Outcome(OutcomeKind.EMPTY)
        self.status.loaded_revision(loaded.id)
        if loaded.id != desired:
            # Published between the two reads: converge straight to it.
            self.status.observed(loaded.id)
            self.metrics.desired_revision.set(loaded.id)
        if loaded.id == self.status.active and self.status.source == "control_plane":
            return Outcome(OutcomeKind.CONVERGED, revision=loaded.id)
        generation = self.state.generation + 1
        snapshot = await self._compile(loaded.body, loaded.id, generation)
        took = trio.current_time() - start
        await self._publish(snapshot, "control_plane", took)
        await self._export(loaded.id, generation, loaded.schema_version, loaded.body)
        return Outcome(OutcomeKind.PUBLISHED, revision=loaded.id, generation=generation,
                       took_s=took)

    def _set_reachable(self, up: bool) -> None:
        was = self.status.control_plane_up
        if not up:
            self.status.unreachable()
        self.metrics.control_plane_up.set(1 if up else 0)
        if was != up:
            self.events.publish("status", {"control_plane_up": up,
                                           "revision": self.status.report()})

    async def _publish(self, snapshot: Snapshot, source: Source, took_s: float) -> None:
        self.state.publish(snapshot)  # the one atomic swap
        self.status.published(snapshot.revision, snapshot.generation, source, took_s)
        self.metrics.active_revision.set(snapshot.revision)
        self.metrics.active_generation.set(snapshot.generation)
        self.metrics.convergence_lag.set(self.status.lag_s)
        log.info("published", revision=snapshot.revision, generation=snapshot.generation,
                 source=source, took_s=round(took_s, 6))
        self.events.publish("published", {
            "revision": snapshot.revision, "generation": snapshot.generation,
            "source": source, "took_s": took_s,
        })
        self._on_status(
            f"serving revision {snapshot.revision} (generation {snapshot.generation}, {source})"
        )
        if self.snapshot_file is not None:
            try:
                await trio.to_thread.run_sync(self.snapshot_file.write, snapshot)
            except OSError as exc:
                self._file_streak.failed(exc, path=self.snapshot_file.path)
            else:
                self._file_streak.ok()

    async def _export(self, revision: int, generation: int, schema_version: int,
                      body: bytes) -> None:
        if self.cache is None:
            return
        from supervisor.sinks.lkg import CacheError

        cache = self.cache

        def run() -> None:
            cache.export(revision=revision, generation=generation,
                         schema_version=schema_version, body=body)

        try:
            await trio.to_thread.run_sync(run)
        except CacheError as exc:
            self.metrics.last_known_good_events.labels("export_failed").inc()
            self._cache_streak.failed(exc)
        else:
            self.metrics.last_known_good_events.labels("exported").inc()
            self._cache_streak.ok()

    def _record_failure(self, exc: ControlPlaneError | RevisionError) -> Outcome:
        reason, revision, detail = _failure_fields(exc)
        self.status.failed(revision, reason, detail)
        self.metrics.revision_rejections.labels(reason).inc()
        self.metrics.convergence_lag.set(self.status.lag_s)
        fields = {"reason": reason, "revision": revision, "detail": detail,
                  "active": self.status.active,
                  "consecutive_failures": self.status.consecutive_failures}
        if revision is not None:
            log.error("revision refused; previous snapshot keeps serving", **fields)
            self.events.publish("rejected", {"revision": revision, "reason": reason,
                                             "detail": detail, "active": self.status.active})
        else:
            log.warning("convergence attempt failed", **fields)
        active = self.status.active
        self._on_status(
            f"serving revision {active}; last attempt failed: {reason}"
            if active is not None else f"not serving; last attempt failed: {reason}"
        )
        return Outcome(OutcomeKind.REJECTED, revision=revision, reason=reason, detail=detail)

    async def converge_once(self, trigger: str = "poll") -> Outcome:
        """One full attempt; never raises on data or store failures (Cancelled propagates)."""
        self.attempts += 1
        with self.metrics.convergence_duration.time():
            try:
                outcome = await self._attempt(observe=trigger not in FAST_TRIGGERS)
            except (ControlPlaneError, RevisionError) as exc:
                outcome = self._record_failure(exc)
            else:
                self.status.succeeded()
        self.metrics.convergence_attempts.labels(outcome.kind.value).inc()
        self.metrics.convergence_lag.set(self.status.lag_s)
        log.debug("convergence attempt", trigger=trigger, outcome=outcome.kind.value,
                  revision=outcome.revision)
        return outcome

    # -- the loop --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bootstrap when nothing is serving yet, report started, then converge forever."""
        if self.state.snapshot is None:
            await self.bootstrap()
        task_status.started()
        trigger = "poll"
        while True:
            # A wake-up that arrived while the attempt ran may concern something
            # the attempt did not see, so it is kept, not cleared.
            outcome = await self.converge_once(trigger)
            if outcome.failed:
                delay = self.backoff.next()
                floor = self.backoff.initial_s
            else:
                self.backoff.reset()
                delay = self.poll_interval_s
                floor = 0.0
            trigger = await self._wait(delay, floor)

    async def _wait(self, delay: float, floor: float) -> str:
        """Sleep ``delay`` unless signalled; never wake before ``floor``."""
        deadline = trio.current_time() + delay
        if floor > 0:
            await trio.sleep(floor)
        with trio.move_on_at(deadline):
            return await self.signal.wait()
        return "poll"

    # -- bootstrap -------------------------------------------------------------

    async def bootstrap(self) -> Outcome:
        """Reach a first servable snapshot, or raise BootRefused naming the refusal."""
        try:
            outcome = await self._attempt()
        except ControlPlaneError as exc:
            self._record_failure(exc)
            if exc.retryable or exc.reason == reasons.INCOMPATIBLE:
                return await self._restore(exc)
            raise BootRefused(
                exc.reason, f"refusing to boot: the control plane refused: {exc}"
            ) from exc
        except RevisionError as exc:
            self._record_failure(exc)
            if exc.reason == reasons.INCOMPATIBLE:
                return await self._restore(exc)
            raise BootRefused(
                exc.reason,
                f"refusing to boot: desired revision {exc.revision} cannot be served "
                f"({exc.reason}): {exc.detail}",
            ) from exc
        if outcome.kind is OutcomeKind.EMPTY:
            raise BootRefused(
                "empty",
                "refusing to boot: the control plane is reachable but has no desired "
                "revision; publish one with `trio-supervisor publish`",
            )
        self.status.succeeded()
        self.metrics.convergence_attempts.labels(outcome.kind.value).inc()
        return outcome

    async def _restore(self, cause: ControlPlaneError | RevisionError) -> Outcome:
        from supervisor.sinks.lkg import CacheError, CacheSkew

        reason, _, detail = _failure_fields(cause)
        if self.cache is None:
            raise BootRefused(
                reason,
                f"refusing to boot: {detail} ({reason}), and no last-known-good cache is "
                "configured ([cache].path)",
            ) from cause
        cache = self.cache
        try:
            cached = await trio.to_thread.run_sync(cache.load)
        except CacheSkew as exc:
            log.error("last-known-good cache written by a newer build (version skew); "
                      "treating it as no cache", path=cache.path, error=str(exc))
            self.metrics.last_known_good_events.labels("refused").inc()
            raise BootRefused(
                "cache",
                f"refusing to boot: {detail} ({reason}); the last-known-good cache is from "
                f"a newer format (version skew), treated as no cache: {exc}",
            ) from exc
        except CacheError as exc:
            self.metrics.last_known_good_events.labels("refused").inc()
            raise BootRefused(
                "cache",
                f"refusing to boot: {detail} ({reason}); the last-known-good cache was "
                f"refused ({exc.reason}): {exc}",
            ) from exc
        if cached is None:
            raise BootRefused(
                reason,
                f"refusing to boot: {detail} ({reason}), and the last-known-good cache "
                "file does not exist yet",
            ) from cause
        generation = self.state.generation + 1
        try:
            snapshot = await self._compile(cached.body, cached.revision, generation)
        except RevisionError as exc:
            self.metrics.last_known_good_events.labels("refused").inc()
            raise BootRefused(
                "cache",
                f"refusing to boot: the last-known-good cache (revision {cached.revision}) "
                f"does not compile ({exc.reason}): {exc.detail}",
            ) from exc
        self.status.loaded_revision(cached.revision)
        await self._publish(snapshot, "last_known_good", 0.0)
        self.metrics.last_known_good_events.labels("restored").inc()
        log.warning("serving the last-known-good cache", revision=cached.revision,
                    age_s=round(cached.age_s, 1), cause=reason)
        return Outcome(OutcomeKind.PUBLISHED, revision=cached.revision, generation=generation)
