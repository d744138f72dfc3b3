"""The convergence loop: observe, hydrate, compile, publish, or say exactly why not.

One task per replica keeps what serves equal to the source's desired revision.
A refused candidate never half-applies: every failure comes before the swap.
The hops, one by one, are in docs/architecture.md ("A revision, from the
database to the sinks").
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

import trio

from supervisor import reasons
from supervisor.bounds import cut
from supervisor.controlplane.errors import ControlPlaneError, SchemaTooNew, StatementRefused
from supervisor.controlplane.store import RevisionPointer
from supervisor.convergence.outcome import Key, Outcome, OutcomeKind, answer_for
from supervisor.convergence.reporting import Reporting
from supervisor.convergence.schedule import Schedule
from supervisor.convergence.side_sinks import SideSinks
from supervisor.convergence.signal import ChangeSignal, WakeupBatch
from supervisor.errors import BootRefused, ConfigError, LabelledError
from supervisor.logs import get_logger
from supervisor.revision.errors import RevisionError
from supervisor.sinks.lkg.statement import Statement
from supervisor.sinks.state import Candidate, Serving
from supervisor.threads import FILE_IO_DEADLINE_S, in_thread

if TYPE_CHECKING:
    from supervisor.config import CacheConfig, ControlPlaneConfig
    from supervisor.controlplane.store import RevisionSource
    from supervisor.revision.secrets import SecretResolver
    from supervisor.revision.snapshot import Snapshot

__all__ = ["THREAD_COMPILE_BYTES", "ConvergenceLoop", "Reporting", "compile_body"]

T = TypeVar("T")

log = get_logger("convergence")

# Bodies above this (about 10,000 aliases, ~6 ms of compile) are compiled in a
# worker thread, so the event loop (admin API, signals, watchdog) keeps answering
# during a large compile.
THREAD_COMPILE_BYTES = 1024 * 1024


def _fresh(exc: RevisionError) -> RevisionError:
    """The same refusal without traceback or context.

    Raised from a worker thread, a refusal's traceback keeps every frame's locals
    alive, the decoded document of a 16 MB body among them. Often in cycles the
    collector rarely frees. The label, the revision and the detail are all the loop
    needs.
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
    """Keeps what serves equal to ``source``'s desired revision (:meth:`run`).

    Every start of the convergence child builds one. It owns nothing that outlives
    a run but what it is given. Built while a snapshot serves, its first attempt
    re-writes the sinks (:attr:`RevisionStatus.sinks_unknown
    <supervisor.convergence.status.RevisionStatus.sinks_unknown>`).
    """

    #: The delay the schedule gave after the last attempt: the wait before the
    #: next one unless woken.
    retry_in_s: float

    def __init__(
        self,
        source: RevisionSource,
        *,
        control_plane: ControlPlaneConfig,
        cache: CacheConfig,
        report: Reporting,
        sinks: SideSinks,
        signal: ChangeSignal,
        resolver: SecretResolver | None = None,
        rng: random.Random | None = None,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.source = source
        self.report = report
        # The loop's record, and what serves (the record reads it too): the one
        # place each is written.
        self.status = report.status
        self.state = report.status.state
        self.sinks = sinks
        self.signal = signal
        self.schedule = Schedule(poll_interval_s=control_plane.poll_interval_s,
                                 backoff_initial_s=control_plane.backoff_initial_s,
                                 backoff_max_s=control_plane.backoff_max_s, rng=rng)
        self.resolver = resolver
        self.cache_config = cache
        self.wall_clock = wall_clock
        self.attempts = 0
        self.status.restarted()
        if self.state.serving is not None:
            # A restart: a sink write still failing is retried whether the store answers or not.
            sinks.resume(self.state.serving)

    # -- one attempt -----------------------------------------------------------

    async def _read(self, read: Callable[[], Awaitable[T]]) -> T:
        """One read of the source; its answer (or not) is the control plane's reachability."""
        try:
            found = await read()
        except ControlPlaneError as exc:
            self.report.reachable(exc.answered)
            if not exc.retryable and exc.revision is not None:
                # Every refusal about a revision is about the desired one.
                self.status.observed(exc.revision)
            raise
        self.report.reachable(True)
        return found

    async def attempt(self) -> Outcome:
        """Observe, hydrate, compile, publish. Raises source and revision errors.

        Observe decides, whatever woke the loop (a NOTIFY, a hint, a request). The
        serving revision's id and digest seen again end the attempt without a hydrate:
        a wake-up costs one small read, not the body. A revision refused for good is
        not hydrated again (:meth:`RevisionStatus.still_refused
        <supervisor.convergence.status.RevisionStatus.still_refused>`).
        """
        start = trio.current_time()
        status = self.status
        status.candidate = None
        await self.sinks.catch_up(self.state.serving)
        pointer = await self._read(self.source.observe)
        if pointer is None:
            return self._empty()
        status.observed(pointer.revision, pointer.body_sha256)
        status.check_epoch(pointer.identity)
        status.candidate = (pointer.revision, pointer.body_sha256)
        if status.is_active(status.candidate) and not status.sinks_unknown:
            await self._restate(pointer)
            return Outcome(OutcomeKind.CONVERGED, revision=pointer.revision)
        repeated = status.still_refused(status.candidate)
        if repeated is not None:
            return repeated
        candidate = await self._read(self.source.hydrate)
        if candidate is None:
            return self._empty()
        # A publish between the two reads is simply the revision converged to.
        status.observed(candidate.id, candidate.body_sha256)
        key: Key = (candidate.id, candidate.body_sha256)
        if key != status.candidate:
            status.candidate = key
            repeated = status.still_refused(key)
            if repeated is not None:
                return repeated
        serving = self.state.serving
        if status.is_active(key):
            assert serving is not None  # is_active
            if status.sinks_unknown:
                # A restart or a new epoch: the sinks may not hold what serves.
                status.sinks_unknown = False
                restated = Serving(serving.snapshot, candidate, serving.source,
                                   self._statement_for(candidate, candidate.sequence))
                await self.sinks.rewrite(restated)
                self.state.serve(restated)
            return Outcome(OutcomeKind.CONVERGED, revision=candidate.id)
        if (serving is not None and serving.revision == candidate.id
                and serving.candidate.body_sha256 != candidate.body_sha256):
            log.warning("revision id reused with different content (a restore followed by "
                        "new publishes?): treating it as a new revision",
                        revision=candidate.id)
        generation = self.state.generation + 1
        snapshot = await compile_body(candidate.body, candidate.id, generation, self.resolver)
        took = trio.current_time() - start
        await self.swap_in(Serving(snapshot, candidate, "control_plane",
                                   self._statement_for(candidate, candidate.sequence)), took)
        self.status.sinks_unknown = False
        return Outcome(OutcomeKind.PUBLISHED, revision=candidate.id, generation=generation,
                       took_s=took)

    # -- the signed statement ---------------------------------------------------

    def _statement_for(self, candidate: Candidate, sequence: int | None) -> Statement | None:
        """What ``candidate`` serves under: the root's (a follower), or one this root signs now.

        None when there is nothing to sign with (no cache, or a source that does not
        read the sequence): the cache is then written as version 1.
        """
        if candidate.statement is not None:
            return candidate.statement
        cache = self.sinks.cache
        if cache is None or cache.signing_key_id is None or sequence is None:
            return None
        now = self.wall_clock()
        return Statement(candidate.id, candidate.body_sha256.hex(), sequence,
                         self.status.identity or "unknown", now,
                         now + timedelta(seconds=self.cache_config.statement_ttl_s))

    async def _restate(self, pointer: RevisionPointer) -> None:
        """Converged: re-sign (a root, past half the TTL) or pass on (a follower) a fresher one.

        Only after a successful observe: a root that cannot read its control plane
        lets its statement age and expire. A rollback to what serves moves only the
        sequence.
        """
        serving = self.state.serving
        assert serving is not None  # converged
        fresh = pointer.statement
        # The cache holds (or is due to hold) what serves; None without a cache,
        # or when what serves came from the cache itself.
        exported = self.sinks.last_export is not None
        if fresh is None:
            served = serving.statement
            due = (served is None or served.sequence != pointer.sequence
                   or served.root != (self.status.identity or "unknown")
                   or served.age_s(self.wall_clock()) >= self.cache_config.statement_ttl_s / 2)
            if due and exported:
                fresh = self._statement_for(serving.candidate, pointer.sequence)
            if fresh is None:
                if pointer.sequence is not None and pointer.sequence != serving.sequence:
                    self.state.serve(serving.restated(served, pointer.sequence))
                return
        elif serving.statement is not None and fresh.etag() == serving.statement.etag():
            return
        restated = serving.restated(fresh, pointer.sequence)
        if exported:
            with trio.CancelScope(shield=True):
                await self.sinks.export(restated)
        self.state.serve(restated)

    def _empty(self) -> Outcome:
        """Nothing is desired. While a snapshot serves, that is news: said once."""
        was = self.status.desired
        self.status.observed(None)
        if was is not None and self.state.snapshot is not None:
            log.warning("the control plane has no desired revision any more (the pointer was "
                        "deleted, or the database restored empty); the previous snapshot "
                        "keeps serving", previously_desired=was,
                        active=self.status.active)
        return Outcome(OutcomeKind.EMPTY)

    async def swap_in(self, serving: Serving, took_s: float) -> None:
        """Export the cache, swap, write the snapshot file: one step a shutdown cannot split.

        The cache is written first. Once swapped, every reader says the new revision
        serves; a stop before the export would leave the cache behind what served.
        Shielded from cancellation (each write is bounded by the disk, not the
        network): a SIGTERM in it takes effect after it. A revision restored from the
        cache is not exported again. A failed export never blocks serving: the sinks
        retry it.
        """
        with trio.CancelScope(shield=True):
            if serving.source == "control_plane":
                await self.sinks.export(serving)
            self.state.serve(serving)
            self.report.published(serving, took_s)
            await self.sinks.write_snapshot_file(serving)

    async def converge_once(self, trigger: str = "poll") -> Outcome:
        """One full attempt; never raises on data or store failures (Cancelled propagates).

        Asks the schedule for the delay before the next attempt
        (:attr:`retry_in_s`), which a failure's log line carries.
        """
        self.attempts += 1
        if trigger == "sighup":
            # The operator's "look again".
            self.status.forget_refusal()
            self.report.forget()
        with self.report.metrics.convergence_duration.time():
            try:
                outcome = await self.attempt()
            except LabelledError as exc:
                outcome = self.report.rejected(exc)
            else:
                if outcome.repeated:
                    self.status.failed(outcome.revision, outcome.reason or "", outcome.detail
                                       or "", refusal=False)
                else:
                    self.status.succeeded()
        self.status.attempt_finished()
        self.retry_in_s = self.schedule.delay_after(outcome)
        if outcome.failed:
            self.report.failed(outcome, self.retry_in_s)
        else:
            self.report.succeeded(self.status.active)
        self.report.metrics.convergence_attempts.labels(outcome.kind.value).inc()
        log.debug("convergence attempt", trigger=trigger, outcome=outcome.kind.value,
                  revision=outcome.revision)
        return outcome

    # -- the loop --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bootstrap when nothing is serving yet, report started, then converge forever.

        The first attempt's trigger is ``poll``; a later one's is the wake-up's that
        ended the wait (``poll`` when none came). Every wake-up taken off the signal is
        answered once its attempt finished, an interrupted one too
        (:class:`~supervisor.convergence.signal.ChangeSignal`).
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

        One attempt of the loop. The signed cache answers exactly three failures: an
        unreachable control plane; a desired revision this build cannot read
        (``incompatible``, a mixed-version rollout); in follower mode, a refused
        statement (``denied``, ``rollback``, ``corrupt``, ``stale``). With
        ``[cache].serve_when_desired_refused``, any refusal of the desired revision too.
        Otherwise nothing falls back (corruption, oversize, refused reads, uncompilable
        revisions): cached state would hide damage an operator must fix. Every refusal
        is :class:`~supervisor.errors.BootRefused` (exit 3). Its message names the cause
        and, when the cache was tried, why it could not serve either.
        """
        try:
            outcome = await self.attempt()
        except SchemaTooNew as exc:
            # A newer build migrated the database: serving a cache meanwhile would
            # hide that this replica must be upgraded; exit 2 as for a bad config.
            raise ConfigError("$.control_plane.url", str(exc)) from exc
        except ControlPlaneError as exc:
            self.report.rejected(exc)
            # A follower's refused statement (denied, rollback, corrupt, stale) is
            # no reason to serve nothing: its own signed cache serves, as for an
            # unreachable upstream, and the refusal stays in last_rejection. Last,
            # the desired revision itself refused (corrupt, too large, missing).
            if (exc.retryable or exc.reason == reasons.INCOMPATIBLE
                    or isinstance(exc, StatementRefused)
                    or (exc.revision is not None and self._serving_cache_instead(exc))):
                return await self._restore(exc)
            raise BootRefused(
                exc.reason, f"refusing to boot: the control plane refused: {cut(str(exc))}"
            ) from exc
        except RevisionError as exc:
            self.report.rejected(exc)
            # unavailable: a transient OS error while resolving a secret (EMFILE ...).
            if (exc.reason in (reasons.INCOMPATIBLE, reasons.UNAVAILABLE)
                    or self._serving_cache_instead(exc)):
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
        self.report.metrics.convergence_attempts.labels(outcome.kind.value).inc()
        return outcome

    def _serving_cache_instead(self, exc: LabelledError) -> bool:
        """``[cache].serve_when_desired_refused``: a refused desired revision boots the cache."""
        if not self.cache_config.serve_when_desired_refused or self.sinks.cache is None:
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
        events = self.report.metrics.last_known_good_events
        try:
            cached = await in_thread(cache.load, dependency="files",
                                     deadline_s=FILE_IO_DEADLINE_S, what="the cache read")
        except CacheError as exc:
            why = f"was refused ({exc.reason})"
            if isinstance(exc, CacheSkew):
                log.error("last-known-good cache written by a newer build (version skew); "
                          "treating it as no cache", path=cache.path, error=str(exc))
                why = "is from a newer format (version skew), treated as no cache"
            events.labels("refused").inc()
            raise BootRefused(
                "cache", f"refusing to boot: {detail} ({reason}); the last-known-good cache "
                f"{why}: {exc}",
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
        statement = cached.statement
        candidate = Candidate(cached.revision, cached.body_sha256, cached.body,
                              cached.schema_version,
                              None if statement is None else statement.sequence, statement)
        await self.swap_in(Serving(snapshot, candidate, "last_known_good", statement), 0.0)
        events.labels("restored").inc()
        self.status.attempt_finished()
        log.warning("serving the last-known-good cache", revision=cached.revision,
                    age_s=round(cached.age_s, 1), cause=reason)
        return Outcome(OutcomeKind.PUBLISHED, revision=cached.revision, generation=generation)
