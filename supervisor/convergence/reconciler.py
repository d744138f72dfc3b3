"""The convergence loop: observe, hydrate, compile, publish, or say exactly why not.

One task per replica keeps the active snapshot equal to the control plane's
desired revision:

1. **observe**: the cheap read of the desired revision's id, body digest and
   the control plane's identity. It runs even when converged, because it is
   both the change detector and the liveness check.
2. **hydrate**: one consistent read of the complete desired revision. A
   revision published between the two reads is simply the one we converge to.
3. **compile**: decode, validate, project, resolve secrets, build an immutable
   :class:`~supervisor.revision.snapshot.Snapshot`.
4. **publish**: export to the last-known-good cache, then one atomic swap in
   :class:`~supervisor.sinks.state.ActiveState`, then the snapshot file.

Every failure happens before step 4 touches anything, so a refused candidate
cannot half-apply: "the previous snapshot keeps serving" follows from the
control flow, not from a cleanup path.

A revision is its content. "Already converged" means the same id *and* the
same body SHA-256 (and the status's lag compares both): after a restore from a
backup an id may come back with another body, which is a new revision
(published, with a log line saying the id was reused). The control plane's
identity (PostgreSQL cluster and database, SQLite file) is compared on every
observe; a change starts a new epoch: it is logged, and the sinks are
re-written from a fresh hydrate.

Why the cache is written *before* the swap (the cache must hold what was
served): once the swap has happened, the snapshot file and every reader say
the new revision is served; a shutdown arriving after the swap but before the
export would leave the cache one revision behind, and a boot during an outage
would then serve an older configuration than the one served before. So the
export, the swap and the snapshot file write run as one step shielded from
cancellation (each write is bounded by the disk, not the network): a SIGTERM
arriving anywhere in it takes effect after it, and at every instant a process
can be stopped the cache holds the revision served or, under SIGKILL, the one
about to be (compiled, not yet swapped), never an older one. This holds for an
operator's rollback too (desired moved to an older id: the cache is lowered to
it before the swap) and a restore from the cache itself (nothing to export:
the cache is the source). A failed export never blocks serving; the cache is
marked due and retried on every poll (and on SIGHUP) until it succeeds, like
the snapshot file, and a sink file that vanished after a successful write is
written again; when the export that failed was a move to an older revision,
the newer cache is removed (unlinking needs no disk space) so a boot cannot
serve what the operator rolled back from.

Polling is the correctness mechanism; the :class:`ChangeSignal` (LISTEN,
SIGHUP, a LISTEN reconnect) only shortens the wait. Delays after an attempt:

- success, converged, empty: ``poll_interval_s``;
- the control plane could not be asked (``unavailable``, ``conflict``): the
  backoff delay (``backoff_initial_s`` doubling to ``backoff_max_s``), reset on
  the next answer, so an outage never becomes a hot loop;
- the control plane answered and the candidate was refused: ``poll_interval_s``.
  A revision refused for a reason that cannot change while its content does not
  (``corrupt``, ``incompatible``, too large, ``validation``, ``projection``) is
  not hydrated again until desired moves or SIGHUP asks to look again (a body
  repaired in place keeps its key); ``secret``, ``snapshot`` (it depends on the
  secrets' values) and the store's own refusals are retried every poll.

Each refusal line carries ``retry_in_s``. A refusal repeated unchanged is
logged at most once a minute (every poll while the cache serves instead of a
refused desired revision), and an outage as a start, progress once a minute
and an end (:class:`~supervisor.outage.OutageLog`).

Bootstrap (:meth:`Reconciler.bootstrap`) reaches a first servable snapshot or
raises :class:`~supervisor.errors.BootRefused` (exit 3). The signed
last-known-good cache answers exactly two failures: an unreachable control
plane, and a desired revision this build cannot read (``incompatible``, a
mixed-version rollout); and, with ``[cache].serve_when_desired_refused``, any
refusal of the desired revision. Otherwise corruption, oversize, refused reads
and uncompilable revisions never fall back: cached state would hide damage an
operator must fix.

A Reconciler is built anew by every start of the convergence child (it owns
nothing that outlives a run but what it is given); one built while a snapshot
is already serving (a restart after a crash) re-writes the sinks from a fresh
hydrate at its first attempt, since a crash may have come between them.
"""

from __future__ import annotations

import enum
import hashlib
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import trio

from supervisor import reasons
from supervisor.backoff import Backoff
from supervisor.controlplane.store import (
    ControlPlaneError,
    FailureCategory,
    Incompatible,
    LoadedRevision,
    RevisionPointer,
    TooLarge,
)
from supervisor.convergence.signal import ChangeSignal, ConvergeAnswer, OutcomeLabel, Wakeup
from supervisor.convergence.status import RevisionStatus, Source
from supervisor.errors import BootRefused
from supervisor.events import EventBus
from supervisor.logs import get_logger
from supervisor.outage import PROGRESS_EVERY_S, OutageLog
from supervisor.revision.errors import RevisionError
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics

if TYPE_CHECKING:
    from supervisor.controlplane.store import ControlPlaneStore
    from supervisor.revision.secrets import SecretResolver
    from supervisor.revision.snapshot import Snapshot
    from supervisor.sinks.file import SnapshotFile
    from supervisor.sinks.lkg import LastKnownGood

__all__ = ["Outcome", "OutcomeKind", "Reconciler", "answer_for"]

log = get_logger("convergence")

# Bodies above this (about 10,000 aliases, ~6 ms of compile) are compiled in a
# worker thread so the event loop (admin
# API, signals, watchdog) keeps answering during a large compile.
THREAD_COMPILE_BYTES = 1024 * 1024

# Wake-ups that already say desired state changed: hydrate without observing first.
FAST_TRIGGERS = frozenset({"notify"})

# The control plane could not be asked: back off.
UNREACHED = frozenset({reasons.UNAVAILABLE, reasons.CONFLICT})

# Compile refusals that only a new body can change (``secret`` is not here:
# the secret may appear; ``unavailable`` is a transient OS error).
# ``snapshot`` (two keys share one secret) depends on the secrets' values, not
# only the body: a rotated secret file can clear it, so it is retried too.
_FINAL_COMPILE = frozenset({
    reasons.CORRUPT, reasons.INCOMPATIBLE, reasons.VALIDATION, reasons.PROJECTION,
})

# A revision's identity: its id and its body's SHA-256 (None: not known yet).
Key = tuple[int, bytes | None]


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
    #: How long the loop waits before the next attempt (absent a wake-up).
    retry_in_s: float | None = None
    #: A refusal already reported for this very revision (not hydrated again).
    repeated: bool = False

    @property
    def failed(self) -> bool:
        return self.kind is OutcomeKind.REJECTED


@dataclass(frozen=True)
class _Export:
    """What the cache is due to hold (kept until a write succeeds)."""

    revision: int
    generation: int
    schema_version: int
    body: bytes


class _Streak:
    """Log a side-sink failure once per failure streak, and its recovery once."""

    def __init__(self, sink: str, metrics: Metrics) -> None:
        self.sink = sink
        self.metrics = metrics
        self.failing = False

    def failed(self, exc: BaseException, **context: object) -> None:
        self.metrics.sink_write_failures.labels(self.sink).inc()
        if not self.failing:
            log.warning("sink write failed; still serving, retrying every poll",
                        sink=self.sink, error=str(exc), **context)
        self.failing = True

    def ok(self, **context: object) -> None:
        if self.failing:
            log.info("sink write recovered", sink=self.sink, **context)
        self.failing = False


def _failure_fields(exc: ControlPlaneError | RevisionError) -> tuple[str, int | None, str]:
    """(reason label, revision or None, detail) of a store or compile failure."""
    if isinstance(exc, RevisionError):
        return exc.reason, exc.revision, exc.detail
    return exc.reason, exc.revision, str(exc)


def _final(exc: ControlPlaneError | RevisionError) -> bool:
    """True when the refusal cannot change while the revision's content does not."""
    if isinstance(exc, RevisionError):
        return exc.reason in _FINAL_COMPILE
    if isinstance(exc, TooLarge | Incompatible):
        return True
    return exc.category is FailureCategory.CORRUPT and exc.revision is not None


def _fresh(exc: RevisionError) -> RevisionError:
    """The same refusal without traceback or context.

    Raised from a worker thread, a refusal's traceback keeps every frame's
    locals alive (the decoded document of a 16 MB body among them), often in
    cycles the collector rarely frees. The label, the revision and the detail
    are all the loop needs.
    """
    return RevisionError(exc.reason, exc.detail, revision=exc.revision)


_ANSWER_LABELS: dict[OutcomeKind, OutcomeLabel] = {
    OutcomeKind.PUBLISHED: "published",
    OutcomeKind.CONVERGED: "converged",
    OutcomeKind.EMPTY: "empty",
    OutcomeKind.REJECTED: "rejected",
}


def answer_for(outcome: Outcome | None) -> ConvergeAnswer:
    """The ``POST /v1/converge`` answer for an attempt (None: it was interrupted).

    A refusal about a revision is ``rejected``; a refusal with no revision
    (the control plane unreachable, or refusing the read) is ``failed``.
    """
    if outcome is None:
        return ConvergeAnswer("failed")
    if outcome.kind is OutcomeKind.REJECTED and outcome.revision is None:
        return ConvergeAnswer("failed", None, outcome.reason)
    return ConvergeAnswer(_ANSWER_LABELS[outcome.kind], outcome.revision, outcome.reason)


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
        on_outage_change: Callable[[bool], None] | None = None,
        serve_cache_on_refusal: bool = False,
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
        # Told True when the control plane stops answering, False when it is
        # back: the LISTEN child probes / reconnects at once instead of waiting.
        self._on_outage_change = on_outage_change or (lambda _down: None)
        self._file_streak = _Streak("snapshot_file", metrics)
        self._cache_streak = _Streak("cache", metrics)
        self._outage = OutageLog(log, "control plane")
        # [cache].serve_when_desired_refused: boot from the cache when desired does not compile.
        self.serve_cache_on_refusal = serve_cache_on_refusal
        self.attempts = 0
        # What each side sink is due to hold until a write succeeds.
        self._file_due: Snapshot | None = None
        self._cache_due: _Export | None = None
        # The last export that succeeded: re-written if the cache file vanishes.
        self._last_export: _Export | None = None
        # A restarted child cannot know whether its predecessor crashed between
        # the swap and a sink: re-write the sinks at the first attempt.
        self._sinks_unknown = state.snapshot is not None
        # The revision refused for a reason only a new body can change.
        self._refused: tuple[Key, Outcome] | None = None
        # The revision the current attempt is about (for the refusal memo).
        self._candidate: Key | None = None
        # (revision, reason, detail) last logged as refused, and when.
        self._last_refusal_line: tuple[tuple[object, ...], float] | None = None

    # -- identity --------------------------------------------------------------

    def _is_active(self, key: Key) -> bool:
        snapshot = self.state.snapshot
        return (
            snapshot is not None
            and self.status.source == "control_plane"
            and snapshot.revision == key[0]
            and self.state.body_sha256 == key[1]
        )

    def _still_refused(self, key: Key) -> Outcome | None:
        if self._refused is None or self._refused[0] != key:
            return None
        return replace(self._refused[1], repeated=True)

    def _learn_desired(self, desired: int | None, body_sha256: bytes | None = None) -> None:
        self.status.observed(desired, body_sha256)
        self.metrics.desired_revision.set(desired or 0)

    def _check_epoch(self, identity: str | None) -> None:
        if identity is None:
            return
        known = self.status.identity
        self.status.identity = identity
        if known is not None and known != identity:
            log.warning(
                "control plane identity changed (a restore, or another database): new "
                "epoch; re-reading the desired revision and re-writing the sinks, and the "
                "cache's rollback mark follows what this epoch serves",
                previous=known, identity=identity,
            )
            self._sinks_unknown = True
            self._refused = None

    # -- one attempt -----------------------------------------------------------

    async def _compile(self, body: bytes, revision: int, generation: int) -> Snapshot:
        from supervisor.revision.compile import compile_revision

        resolver = self.resolver

        def run() -> Snapshot:
            try:
                return compile_revision(
                    body, revision=revision, generation=generation, resolver=resolver
                )
            except RevisionError as exc:
                refusal = _fresh(exc)
            # Raised outside the except block: no __context__ chain either.
            raise refusal

        if len(body) > THREAD_COMPILE_BYTES:
            return await trio.to_thread.run_sync(run, abandon_on_cancel=True)
        return run()

    async def _observe(self) -> RevisionPointer | None:
        try:
            pointer = await self.store.observe()
        except ControlPlaneError:
            self._set_reachable(False)
            raise
        self._set_reachable(True)
        return pointer

    async def _hydrate(self) -> LoadedRevision | None:
        try:
            loaded = await self.store.hydrate()
        except ControlPlaneError as exc:
            if exc.retryable:
                self._set_reachable(False)
            else:
                self._set_reachable(True)
                if exc.revision is not None:
                    # Every hydrate refusal about a revision is about the desired one.
                    self._learn_desired(exc.revision)
            raise
        self._set_reachable(True)
        return loaded

    async def _attempt(self, *, observe: bool = True) -> Outcome:
        """Observe, hydrate, compile, publish. Raises store and revision errors.

        ``observe=False`` skips the cheap read and hydrates straight away: a
        notification already says desired state changed, and hydrate reads the
        desired pointer itself, so the separate round trip would only add latency.
        """
        start = trio.current_time()
        self._candidate = None
        await self._catch_up_sinks()
        if observe:
            pointer = await self._observe()
            if pointer is None:
                return self._empty()
            self._learn_desired(pointer.revision, pointer.body_sha256)
            self._check_epoch(pointer.identity)
            key: Key = (pointer.revision, pointer.body_sha256)
            self._candidate = key
            if self._is_active(key) and not self._sinks_unknown:
                return Outcome(OutcomeKind.CONVERGED, revision=pointer.revision)
            repeated = self._still_refused(key)
            if repeated is not None:
                return repeated
        loaded = await self._hydrate()
        if loaded is None:
            return self._empty()
        self._learn_desired(loaded.id, loaded.body_sha256)
        key = (loaded.id, loaded.body_sha256)
        self._candidate = key
        if self._is_active(key):
            if self._sinks_unknown:
                # A restart or a new epoch: the sinks may not hold what serves.
                self._sinks_unknown = False
                snapshot = self.state.snapshot
                assert snapshot is not None  # _is_active
                self._file_due = snapshot
                self._cache_due = _Export(loaded.id, snapshot.generation,
                                          loaded.schema_version, loaded.body)
                await self._catch_up_sinks()
            return Outcome(OutcomeKind.CONVERGED, revision=loaded.id)
        repeated = self._still_refused(key)
        if repeated is not None:
            return repeated
        active = self.state.snapshot
        if active is not None and active.revision == loaded.id:
            log.warning("revision id reused with different content (a restore followed by "
                        "new publishes?): treating it as a new revision",
                        revision=loaded.id)
        generation = self.state.generation + 1
        snapshot = await self._compile(loaded.body, loaded.id, generation)
        self.status.loaded_revision(loaded.id)
        took = trio.current_time() - start
        # The cache first, then the swap and the snapshot file, as one step a
        # shutdown cannot split: see the module docstring.
        with trio.CancelScope(shield=True):
            await self._export(_Export(loaded.id, generation, loaded.schema_version,
                                       loaded.body))
            await self._publish(snapshot, "control_plane", took,
                                body_sha256=loaded.body_sha256)
        self._sinks_unknown = False
        return Outcome(OutcomeKind.PUBLISHED, revision=loaded.id, generation=generation,
                       took_s=took)

    def _empty(self) -> Outcome:
        """Nothing is desired. While a snapshot serves, that is news: said once."""
        was = self.status.desired
        self._learn_desired(None)
        if was is not None and self.state.snapshot is not None:
            log.warning("the control plane has no desired revision any more (the pointer was "
                        "deleted, or the database restored empty); the previous snapshot "
                        "keeps serving", previously_desired=was,
                        active=self.status.active)
        return Outcome(OutcomeKind.EMPTY)

    def _set_reachable(self, up: bool) -> None:
        was = self.status.control_plane_up
        if not up:
            self.status.unreachable()
        self.metrics.control_plane_up.set(1 if up else 0)
        if was != up:
            self.events.publish("status", {"control_plane_up": up,
                                           "revision": self.status.report()})

    async def _publish(self, snapshot: Snapshot, source: Source, took_s: float, *,
                       body_sha256: bytes | None) -> None:
        self.state.publish(snapshot, body_sha256=body_sha256)  # the one atomic swap
        self.status.published(snapshot.revision, snapshot.generation, source, took_s,
                              body_sha256)
        self.metrics.serving_last_known_good.set(1 if source == "last_known_good" else 0)
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
        self._file_due = snapshot
        await self._write_snapshot_file()

    # -- side sinks ------------------------------------------------------------

    async def _catch_up_sinks(self) -> None:
        """Retry whatever sink write is still due (every attempt, converged or not).

        A sink file that vanished after a successful write (its directory
        removed and re-created, a cleanup) is due again: one ``stat`` per
        attempt notices it.
        """
        snapshot = self.state.snapshot
        if (snapshot is not None and self._file_due is None and self.snapshot_file is not None
                and not await trio.to_thread.run_sync(os.path.exists, self.snapshot_file.path)):
            self._file_due = snapshot
        if (self.cache is not None and self._cache_due is None and self._last_export is not None
                and not await trio.to_thread.run_sync(os.path.exists, self.cache.path)):
            self._cache_due = self._last_export
        if self._file_due is not None:
            await self._write_snapshot_file()
        if self._cache_due is not None:
            await self._export(self._cache_due)

    async def _write_snapshot_file(self) -> None:
        snapshot = self._file_due
        if self.snapshot_file is None or snapshot is None:
            self._file_due = None
            return
        try:
            await trio.to_thread.run_sync(self.snapshot_file.write, snapshot)
        except OSError as exc:
            self._file_streak.failed(exc, path=self.snapshot_file.path)
        else:
            if self._file_due is snapshot:
                self._file_due = None
            self._file_streak.ok(path=self.snapshot_file.path, revision=snapshot.revision)

    async def _export(self, export: _Export) -> None:
        if self.cache is None:
            return
        from supervisor.sinks.lkg import CacheError

        cache = self.cache

        def run() -> None:
            cache.export(revision=export.revision, generation=export.generation,
                         schema_version=export.schema_version, body=export.body)

        def discard() -> bool:
            return cache.discard_if_newer(export.revision)

        self._cache_due = export
        try:
            await trio.to_thread.run_sync(run)
        except CacheError as exc:
            self.metrics.last_known_good_events.labels("export_failed").inc()
            self._cache_streak.failed(exc, revision=export.revision)
            try:
                removed = await trio.to_thread.run_sync(discard)
            except CacheError as discard_exc:
                log.error("the cache holds a newer revision than the one being served and "
                          "could not be removed", error=str(discard_exc))
            else:
                if removed:
                    log.warning("removed a cache newer than the revision being served (a "
                                "rollback whose export failed): a boot now uses the control "
                                "plane rather than the revision rolled back from",
                                path=cache.path, revision=export.revision)
        else:
            self._last_export = export
            if self._cache_due is export:
                self._cache_due = None
            self.metrics.last_known_good_events.labels("exported").inc()
            self._cache_streak.ok(path=cache.path, revision=export.revision)

    # -- reporting -------------------------------------------------------------

    def _record_failure(self, exc: ControlPlaneError | RevisionError) -> Outcome:
        reason, revision, detail = _failure_fields(exc)
        outage = reason in UNREACHED and revision is None
        self.status.failed(revision, reason, detail, refusal=reason != reasons.UNAVAILABLE)
        self.metrics.revision_rejections.labels(reason).inc()
        outcome = Outcome(OutcomeKind.REJECTED, revision=revision, reason=reason, detail=detail)
        if revision is not None:
            self.events.publish("rejected", {"revision": revision, "reason": reason,
                                             "detail": detail, "active": self.status.active})
            candidate = self._candidate
            if _final(exc) and candidate is not None and candidate[0] == revision:
                self._refused = (candidate, outcome)
        if outage and not self._outage.ongoing:
            self._on_outage_change(True)
        return outcome

    def _report_failure(self, outcome: Outcome) -> None:
        """Log a failed attempt (rate-limited when repeated) and update STATUS=."""
        assert outcome.reason is not None
        fields = {"reason": outcome.reason, "revision": outcome.revision,
                  "detail": outcome.detail, "active": self.status.active,
                  "consecutive_failures": self.status.consecutive_failures,
                  "retry_in_s": None if outcome.retry_in_s is None
                  else round(outcome.retry_in_s, 3)}
        if outcome.reason in UNREACHED and outcome.revision is None:
            self._outage.failed(**fields)
        else:
            now = trio.current_time()
            line = (outcome.revision, outcome.reason, outcome.detail)
            last = self._last_refusal_line
            # Serving the cache because desired is refused: said at every poll.
            every_poll = self.status.source == "last_known_good"
            if (every_poll or last is None or last[0] != line
                    or now - last[1] >= PROGRESS_EVERY_S):
                self._last_refusal_line = (line, now)
                if outcome.revision is not None:
                    log.error("revision refused; previous snapshot keeps serving",
                              repeated=outcome.repeated, **fields)
                else:
                    log.error("convergence attempt refused by the control plane; previous "
                              "snapshot keeps serving", **fields)
        active = self.status.active
        self._on_status(
            f"serving revision {active}; last attempt failed: {outcome.reason}"
            if active is not None else f"not serving; last attempt failed: {outcome.reason}"
        )

    def _delay_after(self, outcome: Outcome) -> float:
        if outcome.failed and outcome.reason in UNREACHED:
            return self.backoff.next()
        self.backoff.reset()
        return self.poll_interval_s

    async def converge_once(self, trigger: str = "poll") -> Outcome:
        """One full attempt; never raises on data or store failures (Cancelled propagates).

        The returned outcome carries ``retry_in_s``, the delay the loop waits
        before the next attempt unless woken.
        """
        self.attempts += 1
        if trigger == "sighup":
            # The operator's "look again": a revision repaired in place (its
            # body restored to match its digest) keeps its key, so only this
            # forgets the refusal.
            self._refused = None
            self._last_refusal_line = None
        with self.metrics.convergence_duration.time():
            try:
                outcome = await self._attempt(observe=trigger not in FAST_TRIGGERS)
            except (ControlPlaneError, RevisionError) as exc:
                outcome = self._record_failure(exc)
            else:
                if outcome.repeated:
                    self.status.failed(outcome.revision, outcome.reason or "", outcome.detail
                                       or "", refusal=False)
                else:
                    self.status.succeeded()
        self.status.attempt_finished()
        outcome = replace(outcome, retry_in_s=self._delay_after(outcome))
        if outcome.failed:
            self._report_failure(outcome)
        elif self._outage.recovered(active=self.status.active):
            self._on_outage_change(False)
        self.metrics.convergence_attempts.labels(outcome.kind.value).inc()
        self.metrics.convergence_lag.set(self.status.lag_s)
        log.debug("convergence attempt", trigger=trigger, outcome=outcome.kind.value,
                  revision=outcome.revision)
        return outcome

    # -- the loop --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bootstrap when nothing is serving yet, report started, then converge forever.

        Every wake-up taken off the change signal is answered (``POST
        /v1/converge`` waits on it) once the attempt that consumed it has
        finished, also when that attempt was interrupted.
        """
        if self.state.snapshot is None:
            await self.bootstrap()
        task_status.started()
        wakeup = Wakeup("poll")
        while True:
            # A wake-up that arrived while the attempt ran may concern something
            # the attempt did not see, so it is kept, not cleared.
            outcome: Outcome | None = None
            try:
                outcome = await self.converge_once(wakeup.trigger)
            finally:
                wakeup.resolve(answer_for(outcome))
            assert outcome.retry_in_s is not None
            floor = self.backoff.initial_s if outcome.failed else 0.0
            wakeup = await self._wait(outcome.retry_in_s, floor)

    async def _wait(self, delay: float, floor: float) -> Wakeup:
        """Sleep ``delay`` unless signalled; never wake before ``floor``."""
        deadline = trio.current_time() + delay
        if floor > 0:
            await trio.sleep(floor)
        # A wake-up that came during the floor is taken even when the deadline
        # has passed too (a poll interval shorter than the floor): otherwise it
        # would sit in the channel, never consumed, and its trigger (SIGHUP's
        # "look again") would be lost.
        woken = self.signal.pending()
        if woken is not None:
            return woken
        with trio.move_on_at(deadline):
            return await self.signal.next_wakeup()
        return Wakeup("poll")

    # -- bootstrap -------------------------------------------------------------

    async def bootstrap(self) -> Outcome:
        """Reach a first servable snapshot, or raise BootRefused naming the refusal."""
        try:
            outcome = await self._attempt()
        except ControlPlaneError as exc:
            self._record_failure(exc)
            if exc.retryable or exc.reason == reasons.INCOMPATIBLE:
                return await self._restore(exc)
            if exc.revision is not None and self._serving_cache_instead(exc):
                # The desired revision itself is refused (corrupt, too large, missing).
                return await self._restore(exc)
            raise BootRefused(
                exc.reason, f"refusing to boot: the control plane refused: {exc}"
            ) from exc
        except RevisionError as exc:
            self._record_failure(exc)
            # unavailable: a transient OS error while resolving a secret (EMFILE ...).
            if exc.reason in (reasons.INCOMPATIBLE, reasons.UNAVAILABLE):
                return await self._restore(exc)
            if self._serving_cache_instead(exc):
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
        self.status.attempt_finished()
        self.metrics.convergence_attempts.labels(outcome.kind.value).inc()
        return outcome

    def _serving_cache_instead(self, exc: ControlPlaneError | RevisionError) -> bool:
        """``[cache].serve_when_desired_refused``: a refused desired revision boots the cache."""
        if not self.serve_cache_on_refusal or self.cache is None:
            return False
        reason, revision, detail = _failure_fields(exc)
        log.error("desired revision refused at boot; serving the last-known-good cache "
                  "([cache].serve_when_desired_refused)", reason=reason, revision=revision,
                  detail=detail)
        return True

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
        await self._publish(snapshot, "last_known_good", 0.0,
                            body_sha256=hashlib.sha256(cached.body).digest())
        self.metrics.last_known_good_events.labels("restored").inc()
        self.status.attempt_finished()
        log.warning("serving the last-known-good cache", revision=cached.revision,
                    age_s=round(cached.age_s, 1), cause=reason)
        return Outcome(OutcomeKind.PUBLISHED, revision=cached.revision, generation=generation)
