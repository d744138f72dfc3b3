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

A revision is its content: "already converged" means the same id *and* the
same body SHA-256, and an id that comes back with another body (a restore from
a backup) is a new revision, published with a log line saying the id was
reused. The control plane's identity is compared on every observe; a change
starts a new epoch (the sinks are re-written from a fresh hydrate). What the
loop remembers between attempts (keys, the epoch, the refusal memo below) is
:mod:`~supervisor.convergence.memory`.

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
the snapshot file, and a sink file that vanished or changed after a successful write is
written again; when the export that failed was a move to an older revision,
the newer cache is removed (unlinking needs no disk space) so a boot cannot
serve what the operator rolled back from.

:meth:`ConvergenceLoop.run` bootstraps, then converges forever: it waits for
a wake-up of the change signal or the delay, runs
:meth:`ConvergenceLoop.converge_once`, which asks the
:class:`~supervisor.convergence.schedule.Schedule` (the poll interval, the
backoff while the control plane cannot be asked) for the next delay and logs
it, and answers the wake-ups that attempt consumed. A revision
refused for a reason that cannot change while its content does not
(``corrupt``, ``incompatible``, too large, ``validation``, ``projection``) is
not hydrated again until desired moves or SIGHUP asks to look again (a body
repaired in place keeps its key); ``secret``, ``snapshot`` (it depends on the
secrets' values) and the store's own refusals are retried every poll.

Each refusal line carries ``retry_in_s``. A refusal repeated unchanged and an
outage are each a start, progress once a minute and an end
(:class:`~supervisor.streak.Streak`).

:meth:`ConvergenceLoop.bootstrap` reaches a first servable snapshot (the signed
cache answering an outage) or raises :class:`~supervisor.errors.BootRefused`
(exit 3); :func:`compile_body` compiles a large body off the event loop; the side
sinks live in :mod:`~supervisor.convergence.side_sinks`, the failure log lines in
:mod:`~supervisor.convergence.reporting`, the outcome classification in
:mod:`~supervisor.convergence.outcome`.

A ConvergenceLoop is built anew by every start of the convergence child (it owns
nothing that outlives a run but what it is given); one built while a snapshot
is already serving (a restart after a crash) re-writes the sinks from a fresh
hydrate at its first attempt, since a crash may have come between them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import trio

from supervisor import reasons
from supervisor.bounds import FILE_IO_DEADLINE_S, cut, in_thread
from supervisor.controlplane.errors import ControlPlaneError, SchemaTooNew, StatementRefused
from supervisor.controlplane.store import LoadedRevision, RevisionPointer
from supervisor.convergence.memory import RevisionMemory
from supervisor.convergence.outcome import Key, Outcome, OutcomeKind, answer_for
from supervisor.convergence.reporting import FailureLog
from supervisor.convergence.schedule import Schedule
from supervisor.convergence.side_sinks import Export, SideSinks, SinkStatus
from supervisor.convergence.signal import ChangeSignal, WakeupBatch
from supervisor.convergence.status import RevisionStatus
from supervisor.errors import BootRefused, ConfigError, LabelledError
from supervisor.events import EventBus, Published, Rejected, StatusChanged
from supervisor.logs import get_logger
from supervisor.revision.errors import RevisionError
from supervisor.sinks.lkg.statement import Statement
from supervisor.sinks.state import Source
from supervisor.telemetry import Metrics

if TYPE_CHECKING:
    from supervisor.controlplane.store import ControlPlaneStore
    from supervisor.revision.secrets import SecretResolver
    from supervisor.revision.snapshot import Snapshot
    from supervisor.sinks.file import SnapshotFile
    from supervisor.sinks.lkg import LastKnownGood

__all__ = ["THREAD_COMPILE_BYTES", "ConvergenceLoop", "compile_body"]

log = get_logger("convergence")

# Bodies above this (about 10,000 aliases, ~6 ms of compile) are compiled in a
# worker thread, so the event loop (admin API, signals, watchdog) keeps answering
# during a large compile.
THREAD_COMPILE_BYTES = 1024 * 1024


def _fresh(exc: RevisionError) -> RevisionError:
    """The same refusal without traceback or context.

    Raised from a worker thread, a refusal's traceback keeps every frame's
    locals alive (the decoded document of a 16 MB body among them), often in
    cycles the collector rarely frees. The label, the revision and the detail
    are all the loop needs.
    """
    return RevisionError(exc.reason, exc.detail, revision=exc.revision)


async def compile_body(body: bytes, revision: int, generation: int,
                       resolver: SecretResolver | None) -> Snapshot:
    """The immutable snapshot of ``body``; raises :class:`RevisionError` (no context)."""
    from supervisor.revision.compile import compile_revision

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
        # Bounded by the attempt: no deadline of its own (a compile of a 1 GiB body is slow).
        return await in_thread(run, dependency="cpu", deadline_s=math.inf, what="a compile")
    return run()


class ConvergenceLoop:
    #: The delay the schedule gave after the last attempt (set by every attempt):
    #: the wait before the next one unless woken.
    retry_in_s: float

    def __init__(
        self,
        store: ControlPlaneStore,
        *,
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
        sink_status: SinkStatus | None = None,
        statement_ttl_s: float = 300.0,
        forward_to: str | None = None,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        # What serves (the status reads it too): the one place it is written.
        self.state = status.state
        self.status = status
        self.metrics = metrics
        # The revision gauges read the status: it is the one place they are written.
        metrics.follow_revision(status)
        self.events = events
        # Wake-ups that cut the wait between attempts short.
        self.signal = signal
        self.schedule = Schedule(poll_interval_s=poll_interval_s,
                                 backoff_initial_s=backoff_initial_s,
                                 backoff_max_s=backoff_max_s, rng=rng)
        self.resolver = resolver
        self.sinks = SideSinks(metrics, cache=cache, snapshot_file=snapshot_file,
                               status=sink_status, forward_to=forward_to)
        # [cache].statement_ttl_s: how long a statement this root signs is valid.
        self.statement_ttl_s = statement_ttl_s
        self.wall_clock = wall_clock
        self._on_status = on_status or (lambda _text: None)
        # Told True when the control plane stops answering, False when it is
        # back: the LISTEN child probes / reconnects at once instead of waiting.
        self._on_outage_change = on_outage_change or (lambda _down: None)
        self._failures = FailureLog(status, self._on_status)
        # [cache].serve_when_desired_refused: boot from the cache when desired does not compile.
        self.serve_cache_on_refusal = serve_cache_on_refusal
        self.attempts = 0
        self.memory = RevisionMemory(status)

    def _learn_desired(self, desired: int | None, body_sha256: bytes | None = None) -> None:
        self.status.observed(desired, body_sha256)

    # -- one attempt -----------------------------------------------------------

    async def _observe(self) -> RevisionPointer | None:
        try:
            pointer = await self.store.observe()
        except ControlPlaneError as exc:
            self._set_reachable(exc.answered)
            raise
        self._set_reachable(True)
        return pointer

    async def _hydrate(self) -> LoadedRevision | None:
        try:
            loaded = await self.store.hydrate()
        except ControlPlaneError as exc:
            self._set_reachable(exc.answered)
            if not exc.retryable and exc.revision is not None:
                # Every hydrate refusal about a revision is about the desired one.
                self._learn_desired(exc.revision)
            raise
        self._set_reachable(True)
        return loaded

    async def attempt(self) -> Outcome:
        """Observe, hydrate, compile, publish. Raises store and revision errors.

        Observe decides, whatever woke the loop (a NOTIFY, a hint, a request):
        the active revision's id and digest seen again end the attempt without
        a hydrate, so a wake-up costs one small read, not the body.
        """
        start = trio.current_time()
        memory = self.memory
        memory.candidate = None
        await self.sinks.catch_up(self.state.snapshot)
        pointer = await self._observe()
        if pointer is None:
            return self._empty()
        self._learn_desired(pointer.revision, pointer.body_sha256)
        memory.check_epoch(pointer.identity)
        key: Key = (pointer.revision, pointer.body_sha256)
        memory.candidate = key
        if memory.is_active(key) and not memory.sinks_unknown:
            await self._restate(pointer)
            return Outcome(OutcomeKind.CONVERGED, revision=pointer.revision)
        repeated = memory.still_refused(key)
        if repeated is not None:
            return repeated
        loaded = await self._hydrate()
        if loaded is None:
            return self._empty()
        self._learn_desired(loaded.id, loaded.body_sha256)
        key = (loaded.id, loaded.body_sha256)
        memory.candidate = key
        if memory.is_active(key):
            if memory.sinks_unknown:
                # A restart or a new epoch: the sinks may not hold what serves.
                memory.sinks_unknown = False
                snapshot = self.state.snapshot
                assert snapshot is not None  # is_active
                statement = self._statement_for(loaded)
                await self.sinks.rewrite(snapshot, Export(loaded.id, snapshot.generation,
                                                          loaded.schema_version, loaded.body,
                                                          statement, loaded.body_sha256))
                self.state.restate(statement)
            return Outcome(OutcomeKind.CONVERGED, revision=loaded.id)
        repeated = memory.still_refused(key)
        if repeated is not None:
            return repeated
        active = self.state.snapshot
        if active is not None and active.revision == loaded.id:
            log.warning("revision id reused with different content (a restore followed by "
                        "new publishes?): treating it as a new revision",
                        revision=loaded.id)
        generation = self.state.generation + 1
        snapshot = await compile_body(loaded.body, loaded.id, generation, self.resolver)
        took = trio.current_time() - start
        # The cache first, then the swap and the snapshot file, as one step a
        # shutdown cannot split: see the module docstring.
        statement = self._statement_for(loaded)
        with trio.CancelScope(shield=True):
            await self.sinks.export(Export(loaded.id, generation, loaded.schema_version,
                                           loaded.body, statement, loaded.body_sha256))
            await self.swap_in(snapshot, "control_plane", took, body_sha256=loaded.body_sha256,
                               statement=statement, sequence=loaded.sequence)
        memory.sinks_unknown = False
        return Outcome(OutcomeKind.PUBLISHED, revision=loaded.id, generation=generation,
                       took_s=took)

    # -- the signed statement ---------------------------------------------------

    def _statement_for(self, loaded: LoadedRevision) -> Statement | None:
        """What ``loaded`` serves under: the root's (a follower), or one this root signs now.

        None when there is nothing to sign with (no cache, or a store that
        does not read the sequence): the cache is then written as version 1.
        """
        if loaded.statement is not None:
            return loaded.statement
        cache = self.sinks.cache
        if cache is None or cache.signing_key_id is None or loaded.sequence is None:
            return None
        now = self.wall_clock()
        return Statement(loaded.id, loaded.body_sha256.hex(), loaded.sequence,
                         self.status.identity or "unknown", now,
                         now + timedelta(seconds=self.statement_ttl_s))

    async def _restate(self, pointer: RevisionPointer) -> None:
        """Converged: re-sign (a root, past half the TTL) or pass on (a follower) a fresher one.

        Only after a successful observe, so a root that cannot read its
        control plane lets its statement age and expire.
        """
        if pointer.sequence is not None:
            self.state.sequence = pointer.sequence
        served = self.state.statement
        fresh = pointer.statement
        # The export of what serves (each publish exports before its swap); None without a cache.
        last = self.sinks.last_export
        if fresh is None:
            due = (served is None or served.sequence != pointer.sequence
                   or served.root != (self.status.identity or "unknown")
                   or served.age_s(self.wall_clock()) >= self.statement_ttl_s / 2)
            if not due or last is None:
                return
            fresh = self._statement_for(LoadedRevision(
                id=pointer.revision, schema_version=last.schema_version, body=b"",
                created_at=self.wall_clock(), message=None,
                body_sha256=pointer.body_sha256 or b"", sequence=pointer.sequence))
            if fresh is None:
                return
        elif served is not None and fresh.etag() == served.etag():
            return
        if last is not None:
            with trio.CancelScope(shield=True):
                await self.sinks.export(replace(last, statement=fresh))
        self.state.restate(fresh)

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
        if up:
            self.status.answered()
        else:
            self.status.unreachable()
        if was != up:
            self.events.emit(StatusChanged(control_plane_up=up, revision=self.status.report()))

    async def swap_in(self, snapshot: Snapshot, source: Source, took_s: float, *,
                      body_sha256: bytes | None, statement: Statement | None = None,
                      sequence: int | None = None) -> None:
        """Serve ``snapshot`` (the one atomic swap), report it, write the snapshot file."""
        self.state.swap(snapshot, source=source, body_sha256=body_sha256, statement=statement,
                        sequence=sequence)
        self.status.published(took_s)
        # As /status tells it: a follower names its upstream in place of control_plane.
        origin = self.state.origin or source
        log.info("published", revision=snapshot.revision, generation=snapshot.generation,
                 source=origin, took_s=round(took_s, 6))
        self.events.emit(Published(revision=snapshot.revision, generation=snapshot.generation,
                                   source=origin, took_s=took_s))
        self._on_status(
            f"serving revision {snapshot.revision} (generation {snapshot.generation}, {origin})"
        )
        await self.sinks.write_snapshot_file(snapshot)

    # -- reporting -------------------------------------------------------------

    def record_failure(self, exc: LabelledError) -> Outcome:
        # Cut where it enters: the status, the log, the events and the memo carry the cut text.
        reason, revision, detail = exc.reason, exc.revision, cut(exc.detail)
        outage = reason == reasons.UNAVAILABLE and revision is None
        self.status.failed(revision, reason, detail, refusal=reason != reasons.UNAVAILABLE)
        self.metrics.revision_rejections.labels(reason).inc()
        outcome = Outcome(OutcomeKind.REJECTED, revision=revision, reason=reason, detail=detail)
        if revision is not None:
            self.events.emit(Rejected(revision=revision, reason=reason, detail=detail,
                                      active=self.status.active))
            self.memory.remember_refusal(exc, outcome)
        if outage and not self._failures.outage.ongoing:
            self._on_outage_change(True)
        return outcome

    async def converge_once(self, trigger: str = "poll") -> Outcome:
        """One full attempt; never raises on data or store failures (Cancelled propagates).

        Asks the schedule for the delay before the next attempt
        (:attr:`retry_in_s`), which a failure's log line carries.
        """
        self.attempts += 1
        if trigger == "sighup":
            # The operator's "look again": a revision repaired in place (its
            # body restored to match its digest) keeps its key, so only this
            # forgets the refusal.
            self.memory.forget_refusal()
            self._failures.forget()
        with self.metrics.convergence_duration.time():
            try:
                outcome = await self.attempt()
            except LabelledError as exc:
                outcome = self.record_failure(exc)
            else:
                if outcome.repeated:
                    self.status.failed(outcome.revision, outcome.reason or "", outcome.detail
                                       or "", refusal=False)
                else:
                    self.status.succeeded()
        self.status.attempt_finished()
        self.retry_in_s = self.schedule.delay_after(outcome)
        if outcome.failed:
            self._failures.report(outcome, self.retry_in_s)
        elif self._failures.succeeded(self.status.active):
            self._on_outage_change(False)
        self.metrics.convergence_attempts.labels(outcome.kind.value).inc()
        log.debug("convergence attempt", trigger=trigger, outcome=outcome.kind.value,
                  revision=outcome.revision)
        return outcome

    # -- the loop --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bootstrap when nothing is serving yet, report started, then converge forever.

        The first attempt's trigger is ``poll``; every later one's is the
        wake-up's that ended the wait (``poll`` when none came). Every wake-up
        taken off the change signal is answered (``POST /v1/converge`` waits on
        it) once the attempt that consumed it has finished, also when that
        attempt was interrupted. One that arrives while an attempt runs is kept
        for the next: it may concern something the running attempt did not see.
        """
        if self.state.snapshot is None:
            await self.bootstrap()
        task_status.started()
        wakeup = WakeupBatch("poll")
        while True:
            outcome: Outcome | None = None
            try:
                outcome = await self.converge_once(wakeup.trigger)
            finally:
                wakeup.resolve(answer_for(outcome))
            wakeup = await self._next_wakeup(self.retry_in_s, self.schedule.floor_after(outcome))

    async def _next_wakeup(self, delay: float, floor: float) -> WakeupBatch:
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
        return WakeupBatch("poll")

    async def bootstrap(self) -> Outcome:
        """Reach a first servable snapshot, or raise BootRefused naming the refusal.

        Boot: reach a first servable snapshot, or refuse to boot naming why.

        One attempt of the loop. The signed last-known-good
        cache answers exactly three failures: an unreachable control plane, a
        desired revision this build cannot read (``incompatible``, a mixed-version
        rollout), and, in follower mode, an upstream statement refused
        (``denied``, ``rollback``, ``corrupt``, ``stale``); and, with
        ``[cache].serve_when_desired_refused``, any refusal of the desired revision.
        Otherwise corruption, oversize, refused reads and uncompilable revisions never
        fall back: cached state would hide damage an
        operator must fix. Every refusal is :class:`~supervisor.errors.BootRefused`
        (exit 3), its message naming the cause and, when the cache was tried, why it
        could not serve either.
        """
        try:
            outcome = await self.attempt()
        except SchemaTooNew as exc:
            # A newer build migrated the database: serving a cache meanwhile would
            # hide that this replica must be upgraded; exit 2 as for a bad config.
            raise ConfigError("$.control_plane.url", str(exc)) from exc
        except ControlPlaneError as exc:
            self.record_failure(exc)
            # A follower's refused statement (denied, rollback, corrupt, stale) is
            # no reason to serve nothing: its own signed cache serves, as for an
            # unreachable upstream, and the refusal stays in last_rejection.
            if (exc.retryable or exc.reason == reasons.INCOMPATIBLE
                    or isinstance(exc, StatementRefused)):
                return await self._restore(exc)
            if exc.revision is not None and self._serving_cache_instead(exc):
                # The desired revision itself is refused (corrupt, too large, missing).
                return await self._restore(exc)
            raise BootRefused(
                exc.reason, f"refusing to boot: the control plane refused: {cut(str(exc))}"
            ) from exc
        except RevisionError as exc:
            self.record_failure(exc)
            # unavailable: a transient OS error while resolving a secret (EMFILE ...).
            if exc.reason in (reasons.INCOMPATIBLE, reasons.UNAVAILABLE):
                return await self._restore(exc)
            if self._serving_cache_instead(exc):
                return await self._restore(exc)
            raise BootRefused(
                exc.reason,
                f"refusing to boot: desired revision {exc.revision} cannot be served "
                f"({exc.reason}): {cut(exc.detail)}",
            ) from exc
        if outcome.kind is OutcomeKind.EMPTY:
            raise BootRefused(
                "empty",
                "refusing to boot: the control plane is reachable but has no desired "
                "revision; publish one with `trio-supervisor publish`",
            )
        self.status.attempt_finished()
        self.metrics.convergence_attempts.labels(outcome.kind.value).inc()
        return outcome

    def _serving_cache_instead(self, exc: LabelledError) -> bool:
        """``[cache].serve_when_desired_refused``: a refused desired revision boots the cache."""
        if not self.serve_cache_on_refusal or self.sinks.cache is None:
            return False
        log.error("desired revision refused at boot; serving the last-known-good cache "
                  "([cache].serve_when_desired_refused)", reason=exc.reason,
                  revision=exc.revision, detail=cut(exc.detail))
        return True

    async def _restore(self, cause: LabelledError) -> Outcome:
        from supervisor.sinks.lkg import CacheError, CacheSkew

        reason, detail = cause.reason, cut(cause.detail)
        cache = self.sinks.cache
        if cache is None:
            raise BootRefused(
                reason,
                f"refusing to boot: {detail} ({reason}), and no last-known-good cache is "
                "configured ([cache].path)",
            ) from cause
        events = self.metrics.last_known_good_events
        try:
            cached = await in_thread(cache.load, dependency="files",
                                     deadline_s=FILE_IO_DEADLINE_S, what="the cache read")
        except CacheSkew as exc:
            log.error("last-known-good cache written by a newer build (version skew); "
                      "treating it as no cache", path=cache.path, error=str(exc))
            events.labels("refused").inc()
            raise BootRefused(
                "cache",
                f"refusing to boot: {detail} ({reason}); the last-known-good cache is from "
                f"a newer format (version skew), treated as no cache: {exc}",
            ) from exc
        except CacheError as exc:
            events.labels("refused").inc()
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
            snapshot = await compile_body(cached.body, cached.revision, generation, self.resolver)
        except RevisionError as exc:
            events.labels("refused").inc()
            raise BootRefused(
                "cache",
                f"refusing to boot: the last-known-good cache (revision {cached.revision}) "
                f"does not compile ({exc.reason}): {cut(exc.detail)}",
            ) from exc
        await self.swap_in(snapshot, "last_known_good", 0.0,
                           body_sha256=cached.body_sha256,
                           statement=cached.statement)
        events.labels("restored").inc()
        self.status.attempt_finished()
        log.warning("serving the last-known-good cache", revision=cached.revision,
                    age_s=round(cached.age_s, 1), cause=reason)
        return Outcome(OutcomeKind.PUBLISHED, revision=cached.revision, generation=generation)
