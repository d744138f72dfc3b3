"""Leader election for the fan-out on a Lease, as controller-runtime (client-go) does it.

:class:`LeaderElector` elects; :class:`LeadershipStatus`, :func:`announcer` and
:class:`LeadershipMetrics` report it. Operators: docs/operations.md, "High availability".
"""

from __future__ import annotations

import math
import os
import random
import socket
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime
from enum import Enum

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge

from supervisor.errors import SupervisorError
from supervisor.events import EventBus, StatusChanged
from supervisor.kube.errors import Conflict, KubeError
from supervisor.kube.lease import LeaseApi, LeaseRecord
from supervisor.logs import get_logger
from supervisor.status_doc import LeadershipReport, Role
from supervisor.streak import Streak

__all__ = [
    "LeadEnded",
    "LeaderElector",
    "LeadershipMetrics",
    "LeadershipStatus",
    "announcer",
    "default_identity",
]

log = get_logger("leadership")


def default_identity() -> str:
    """``<hostname>_<pid>_<random>``: unique per process, readable in ``kubectl get lease``."""
    host = socket.gethostname().split(".")[0] or "replica"
    return f"{host[:80]}_{os.getpid()}_{random.getrandbits(32):08x}"


@dataclass
class LeadershipStatus:
    """What /status reports as ``leadership``; the elector writes it."""

    role: Role = "disabled"
    holder: str | None = None
    lease: str | None = None
    identity: str | None = None

    def report(self) -> LeadershipReport:
        return LeadershipReport(role=self.role, holder=self.holder, lease=self.lease)


def announcer(events: EventBus, status_line: Callable[[str], None],
              ) -> Callable[[LeadershipStatus], None]:
    """An ``on_change`` that tells the stream (a ``status`` event) and systemd (``STATUS=``).

    Only real changes of the report are announced; the elector logs them itself.
    """
    last: list[LeadershipReport] = []

    def changed(status: LeadershipStatus) -> None:
        report = status.report()
        if last and last[0] == report:
            return
        last[:] = [report]
        events.emit(StatusChanged(leadership=report))
        if status.role == "leader":
            status_line(f"fan-out leader (lease {status.lease})")
        else:
            status_line(f"fan-out standby (leader: {status.holder or 'none'})")

    return changed


class LeadershipMetrics:
    """``supervisor_leader`` (1 while this replica leads) and the transitions counter.

    Defined here, not in :mod:`supervisor.telemetry`: they exist only with election on.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.leader = Gauge("leader", "1 while this replica holds the fan-out Lease, else 0.",
                            namespace="supervisor", registry=registry)
        self.transitions = Counter(
            "leader_transitions", "Times this replica became or stopped being the fan-out "
            "leader.", ["to"], namespace="supervisor", registry=registry)
        for to in ("leader", "standby"):
            self.transitions.labels(to)


class LeadEnded(SupervisorError):
    """The fan-out returned while leading (it runs until cancelled): a bug, fail the child."""


class _Try(Enum):
    HELD = "held"  # we hold the lease now (acquired or renewed)
    OTHER = "other"  # someone else holds it and it has not expired
    FAILED = "failed"  # the attempt failed (error or conflict); try again


@dataclass(eq=False)
class LeaderElector:
    """Runs ``lead`` (the whole fan-out group) only while holding the Lease ``leases`` names.

    Needs ``retry_period_s < renew_deadline_s < lease_duration_s``. ``status`` is
    updated in place, then handed to ``on_change`` at every change of role or
    observed holder; the metrics follow.

    **Acquire.** Every ``retry_period_s`` a standby reads the Lease. A free one is
    taken at once. One whose record has not changed for ``leaseDurationSeconds``, by
    this replica's own monotonic clock since it saw that resourceVersion, is taken
    over. A missing Lease is created, unless its last holder seen here is someone
    else not expired in our view (an operator's delete, a restore): that one leads
    on until then. Every write carries the resourceVersion read: a write in between
    makes it a 409, and nothing is taken.

    **Ours means written by us.** A record naming our identity is ours only with a
    ``renewTime`` this elector wrote. A twin with the same identity, or a Lease
    edited or restored to name us, is someone else's (a warning, once). So a
    restarted process with a fixed identity waits out its predecessor's lease.

    **Renew.** The leader writes ``renewTime`` every ``retry_period_s``. No success
    within ``renew_deadline_s`` of the *start* of the last good one, or a conflict
    showing another holder, loses leadership. ``lead`` is cancelled at that moment:
    no fan-out write starts after it (those in flight get the drain). Others wait
    ``lease_duration_s`` from when they saw our last renewal, no earlier than its
    start, so the loss comes first.

    **Clocks.** Replicas' clocks *run* at about the same rate over a lease duration.
    No wall clock is compared with another's: ``renewTime`` is for humans, expiry is
    local elapsed time. And a leader is never frozen longer than
    ``lease_duration_s - renew_deadline_s`` minus the drain.

    **Release.** Cancelled while leading, ``lead`` stops first (its drain included).
    Then the Lease is written with no holder and a 1 s duration, as client-go: a
    standby takes over within its retry period. Bounded by ``release_timeout_s``
    (:meth:`_release`). An end of leadership shows at once in the role, the gauge and
    the log, whatever ended it. Re-acquiring starts ``lead`` fresh: the fan-out
    re-reads all state.
    """

    leases: LeaseApi
    _: KW_ONLY
    identity: str
    lease_duration_s: float
    renew_deadline_s: float
    retry_period_s: float
    status: LeadershipStatus = field(default_factory=LeadershipStatus)
    metrics: LeadershipMetrics | None = None
    on_change: Callable[[LeadershipStatus], None] | None = None
    release_timeout_s: float = 2.0
    wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("need retry_period_s < renew_deadline_s < lease_duration_s")
        self.status.role = "standby"
        self.status.lease = self.leases.where
        self.status.identity = self.identity
        # Lease requests failing in a row: the first at warning (an outage is long).
        self._failures = Streak(log, began="lease request failed",
                                ended="lease requests succeed again", count_as="failures")
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # local monotonic time the observed record was first seen
        self._renewed_at = 0.0  # local time the last successful write *started*
        # The renewTimes this elector wrote (the last few, answered or not): a record
        # naming our identity is ours only if it carries one of them. Another replica
        # configured with the same identity, or a Lease edited or restored to name
        # us, is someone else's record.
        self._written: list[datetime] = []
        # A write was sent and its answer has not come (it may have landed).
        self._writing = False
        self._warned_identity = False
        self.lost_at: float | None = None  # local time leadership was last considered lost
        self.leading = False

    # -- the loop ---------------------------------------------------------------------

    async def run(self, lead: Callable[[], Awaitable[None]], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Elect, lead while elected, stand by otherwise; release on cancellation."""
        self._changed()
        task_status.started()
        try:
            while True:
                while await self._attempt() is not _Try.HELD:  # acquire
                    await trio.sleep(self.retry_period_s * self.rng.uniform(0.9, 1.0))
                await self._lead(lead)
        finally:
            # A write still unanswered (acquire or renew) may have landed: re-read.
            if self._writing or (self._observed is not None and self._ours(self._observed)):
                with trio.move_on_after(self.release_timeout_s, shield=True):
                    await self._release(reread=self._writing)

    async def _lead(self, lead: Callable[[], Awaitable[None]]) -> None:
        self.leading = True
        log.info("fan-out leadership acquired", lease=self.leases.where,
                 identity=self.identity, holder=self.status.holder)
        self._changed(transition=True)
        why = "the fan-out failed, or the replica is stopping"
        try:
            async with trio.open_nursery() as nursery:

                async def run_lead() -> None:
                    await lead()
                    # ``lead`` runs until cancelled; returning is a bug: fail the child (its
                    # restart releases the lease on the way out) rather than hold a lease
                    # for a fan-out that is not running.
                    raise LeadEnded("the fan-out ended while leading")

                nursery.start_soon(run_lead)
                why = await self._renew_until_lost()
                # No checkpoint between the decision and the cancellation: no fan-out
                # write starts after this moment (those in flight get the drain).
                self.lost_at = trio.current_time()
                self.leading = False
                nursery.cancel_scope.cancel()
        finally:
            # Also when the fan-out crashed or shutdown cancelled us: /status, the
            # gauge and the log must never say "leader" for a fan-out that stopped.
            self.leading = False
            log.warning("fan-out leadership lost; fan-out stopped", lease=self.leases.where,
                        identity=self.identity, holder=self.status.holder, why=why)
            self._changed(transition=True)

    async def _renew_until_lost(self) -> str:
        """Renew every retry period; return why leadership was lost."""
        while True:
            await trio.sleep(self.retry_period_s)
            with trio.move_on_at(self._renewed_at + self.renew_deadline_s):
                while True:
                    outcome = await self._attempt()
                    if outcome is _Try.HELD:
                        break
                    if outcome is _Try.OTHER:
                        holder = self._observed.holder if self._observed else None
                        return f"the lease is held by {holder or 'nobody'}"
                    await trio.sleep(self.retry_period_s)
                continue
            return (f"no renewal succeeded within renew_deadline_s "
                    f"({self.renew_deadline_s:g} s)")

    # -- one attempt ------------------------------------------------------------------

    async def _attempt(self) -> _Try:
        started = trio.current_time()
        try:
            with trio.fail_after(self.renew_deadline_s):
                outcome = await self._try(started)
        except Conflict:
            # Someone wrote in between: read it again at once; it may show a new holder.
            try:
                with trio.fail_after(self.renew_deadline_s):
                    current = await self.leases.get()
            except (KubeError, trio.TooSlowError):
                return _Try.FAILED
            self._observe(current, trio.current_time())
            taken = current is not None and current.holder is not None and not self._ours(current)
            return _Try.OTHER if taken and self.leading else _Try.FAILED
        except (KubeError, trio.TooSlowError) as exc:
            error = str(exc) if isinstance(exc, KubeError) else (
                f"no answer within {self.renew_deadline_s:g} s")
            self._failures.failed(lease=self.leases.where, leading=self.leading, error=error)
            return _Try.FAILED
        self._failures.recovered(lease=self.leases.where)
        return outcome

    async def _try(self, started: float) -> _Try:
        now = self.wall_clock()
        current = await self.leases.get()
        if current is None:
            last = self._observed
            if (last is not None and last.holder and not self._ours(last)
                    and not self._expired(last)):
                # Deleted (an operator, a restore) while someone else held it: their
                # lease runs on in their view until it expires in ours.
                return _Try.OTHER
            fresh = LeaseRecord(holder=self.identity, duration_s=self._duration(),
                                acquire_time=now, renew_time=now, transitions=0)
            self._won(await self._write(self.leases.create, fresh), started)
            return _Try.HELD
        # Observed when the answer arrived (not when asked): the holder's write may
        # have happened any time before that, never after.
        self._observe(current, trio.current_time())
        ours = self._ours(current)
        if current.holder == self.identity and not ours and not self._warned_identity:
            self._warned_identity = True
            log.warning("the fan-out Lease names this replica's identity but was not written "
                        "by it: another replica uses the same [kubernetes].identity, or the "
                        "Lease was edited or restored; treated as someone else's lease",
                        lease=self.leases.where, identity=self.identity)
        if not ours and (self.leading or (current.holder and not self._expired(current))):
            # Someone else's, not expired. Or, while we think we are leading, the record
            # says we no longer hold it (someone took an expired lease from us): never
            # take it back then.
            return _Try.OTHER
        update = replace(current, holder=self.identity, duration_s=self._duration(),
                             renew_time=now)
        if not ours:
            update = replace(update, acquire_time=now, transitions=current.transitions + 1)
        self._won(await self._write(self.leases.update, update), started)
        return _Try.HELD

    async def _write(self, call: Callable[[LeaseRecord], Awaitable[LeaseRecord]],
                     record: LeaseRecord) -> LeaseRecord:
        """One write naming us; remembered as ours before it is sent (it may land unanswered)."""
        if record.renew_time is not None:
            self._written = [*self._written[-7:], record.renew_time]
        self._writing = True
        try:
            written = await call(record)
        except BaseException as exc:
            # Cancelled: unanswered, it may have landed (the release re-reads). Anything
            # else was answered (refused) or never sent.
            self._writing = isinstance(exc, trio.Cancelled)
            raise
        self._writing = False
        return written

    def _ours(self, record: LeaseRecord) -> bool:
        """The record names us *and* carries a renewTime this elector wrote."""
        return (record.holder == self.identity and record.renew_time is not None
                and record.renew_time in self._written)

    def _duration(self) -> int:
        # Rounded up: the Lease's field is whole seconds, and a shorter lease than
        # we act on (4.5 s written as 4) would let a standby in while we still lead.
        return max(1, math.ceil(self.lease_duration_s))

    def _observe(self, record: LeaseRecord | None, now: float) -> None:
        old = self._observed
        if record is None:
            # Kept: a deleted Lease's last holder keeps leading until it expires here.
            return
        if old is None or old.resource_version != record.resource_version:
            self._observed = record
            self._observed_at = now
            if old is None or old.holder != record.holder:
                self.status.holder = record.holder
                if not self.leading:
                    log.info("fan-out leader observed", lease=self.leases.where,
                             identity=self.identity, holder=record.holder)
                    self._changed()

    def _expired(self, record: LeaseRecord) -> bool:
        duration = record.duration_s if record.duration_s is not None else self.lease_duration_s
        return trio.current_time() >= self._observed_at + duration

    def _won(self, record: LeaseRecord, started: float) -> None:
        self._observed = record
        self._observed_at = started
        self._renewed_at = started
        self.status.holder = self.identity

    async def _release(self, *, reread: bool = False) -> None:
        """Write the Lease with no holder; once more on a 409 if it still names us.

        ``reread``: a write of ours may have landed unanswered, so what we last
        observed says nothing: read the Lease first and release it only if ours.
        """
        current = self._observed
        error = "conflicting writes"
        try:
            if reread:
                current = await self.leases.get()
            for _ in range(2):
                if current is None or not self._ours(current):
                    return  # not ours (any more): nothing to release
                try:
                    self._observed = await self.leases.update(
                        replace(current, holder=None, duration_s=1, renew_time=self.wall_clock()))
                except Conflict:
                    # A renewal cancelled in flight may have landed: read it again.
                    current = await self.leases.get()
                    continue
                self.status.holder = None
                log.info("fan-out lease released", lease=self.leases.where,
                         identity=self.identity)
                return
        except KubeError as exc:
            error = str(exc)
        log.warning("could not release the fan-out lease; a standby takes over when it "
                    "expires", lease=self.leases.where, error=error)

    # -- reporting --------------------------------------------------------------------

    def _changed(self, *, transition: bool = False) -> None:
        role: Role = "leader" if self.leading else "standby"
        previous = self.status.role
        self.status.role = role
        if self.metrics is not None:
            self.metrics.leader.set(1.0 if role == "leader" else 0.0)
            if previous != role and transition:
                self.metrics.transitions.labels(role).inc()
        if self.on_change is not None:
            self.on_change(self.status)
