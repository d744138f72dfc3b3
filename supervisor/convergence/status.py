"""What one replica reports about its convergence: :class:`RevisionStatus`, /status ``revision``.

Each key's meaning: docs/admin-api.md (from ``tools.docs_catalog.STATUS_KEYS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec
import trio

from supervisor.bounds import cut
from supervisor.convergence.outcome import Key, Outcome, is_final
from supervisor.events import utc_now_iso
from supervisor.logs import get_logger
from supervisor.status_doc import Rejection, RevisionReport

if TYPE_CHECKING:
    from supervisor.errors import LabelledError
    from supervisor.sinks.state import ActiveState, Source

__all__ = ["RevisionStatus"]

log = get_logger("convergence")


class RevisionStatus:
    """The loop's record of its attempts, and the ``revision`` report built from it.

    The serving revision (active, generation, source, body digest, statement,
    sequence) is read from the :class:`~supervisor.sinks.state.ActiveState`, never
    copied here. ``loaded`` is ``active``: every compiled revision swaps in at once,
    and a refused one never shows. ``last_error`` and ``control_plane_up`` show an
    outage in the report itself, not only as a growing lag.

    It also remembers, between attempts, the revision refused for good and the control
    plane's epoch. Revisions are known by :data:`~supervisor.convergence.outcome.Key`,
    id and body digest (why: :class:`~supervisor.sinks.state.Candidate`). One loop (one
    task) writes it: no lock.
    """

    #: True while the sinks may not hold what serves (set by :meth:`restarted`; a new epoch).
    sinks_unknown: bool
    #: The revision the current attempt is about (for the refusal memo).
    candidate: Key | None = None
    # The revision refused for a reason only a new body can change.
    _refused: tuple[Key, Outcome] | None = None

    def __init__(self, state: ActiveState, clock: Callable[[], float] = trio.current_time,
                 wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        #: What serves: the one owner of the serving revision.
        self.state = state
        self._clock = clock
        self._wall_clock = wall_clock
        self.desired: int | None = None
        self.last_convergence_s: float | None = None
        self.consecutive_failures = 0
        self.last_rejection: Rejection | None = None
        self.last_error: str | None = None
        self.control_plane_up = False
        self._ever_read = False
        # Who answered last (RevisionPointer.identity); a change is a new epoch.
        self.identity: str | None = None
        # Start of the clock for liveness: no attempt finished yet counts from here.
        self.last_attempt_at = clock()
        # Body digest of the desired revision (None: unknown): see lag_s.
        self.desired_sha256: bytes | None = None
        # Clock reading when desired first differed from active; None when converged.
        self._diverged_at: float | None = None

    def _track_lag(self) -> None:
        converged = (
            self.control_plane_up
            and self.source == "control_plane"
            and self.desired is not None
            and self.desired == self.active
            and (self.desired_sha256 is None or self.desired_sha256 == self.state.body_sha256)
        )
        if converged:
            self._diverged_at = None
        elif self._diverged_at is None:
            self._diverged_at = self._clock()

    @property
    def active(self) -> int | None:
        snapshot = self.state.snapshot
        return None if snapshot is None else snapshot.revision

    @property
    def generation(self) -> int:
        return self.state.generation

    @property
    def source(self) -> Source | None:
        return self.state.source

    @property
    def lag_s(self) -> float:
        """Seconds since desired first differed from active (0.0 when converged).

        Converged is the same id and digest (:class:`~supervisor.sinks.state.Candidate`),
        from the control plane. While it is unreachable, desired is unknown: lag grows
        from when the replica last knew it converged. In follower mode too it is the
        divergence only; a root that stopped signing shows as ``statement_age_s``.
        """
        return 0.0 if self._diverged_at is None else max(0.0, self._clock() - self._diverged_at)

    @property
    def statement_expires_at(self) -> float:
        """Unix time the statement serving expires (0.0 without one)."""
        statement = self.state.statement
        return statement.expires_at.timestamp() if statement is not None else 0.0

    def observed(self, desired: int | None, body_sha256: bytes | None = None) -> None:
        """A successful read: the control plane is up and desires ``desired``.

        ``body_sha256`` is the desired body's digest when the read learned it;
        a different id, or an unknown digest, forgets the previous one.
        """
        self.control_plane_up = True
        self._ever_read = True
        if body_sha256 is not None or desired != self.desired:
            self.desired_sha256 = body_sha256
        self.desired = desired
        self._track_lag()

    def answered(self) -> None:
        """The control plane answered (a read, or a refusal): it is up."""
        self.control_plane_up = True
        self._ever_read = True
        self._track_lag()

    def unreachable(self) -> None:
        self.control_plane_up = False
        self._ever_read = True
        self._track_lag()

    def published(self, took_s: float) -> None:
        """The state has just swapped in a snapshot, ``took_s`` after its attempt began."""
        self.last_convergence_s = took_s
        if self.source == "control_plane":
            # The attempt has succeeded from the swap on: a reader of /status
            # between the swap and the end of the attempt (the snapshot file
            # is still being written) must not see the outage's count next to
            # the new revision. A restore from the cache is no success.
            self.succeeded()
        self._track_lag()

    def attempt_finished(self) -> None:
        self.last_attempt_at = self._clock()

    def stalled_for(self) -> float:
        """Seconds since the last attempt finished (or since start, before the first).

        ``/healthz`` and the watchdog compare it with :func:`supervisor.health.stall_limit_s`.
        """
        return max(0.0, self._clock() - self.last_attempt_at)

    def succeeded(self) -> None:
        self.consecutive_failures = 0
        self.last_error = None

    def failed(self, revision: int | None, reason: str, detail: str, *,
               refusal: bool = True) -> None:
        """A failed attempt; a refusal (anything but an outage) sets ``last_rejection``.

        Both texts are cut to :data:`~supervisor.bounds.DETAIL_BYTES`, whatever the
        revision held.
        """
        self.consecutive_failures += 1
        detail = cut(detail)
        self.last_error = cut(f"{reason}: {detail}")
        if refusal:
            self.last_rejection = Rejection(revision=revision, reason=reason, detail=detail,
                                            at=utc_now_iso())
        self._track_lag()

    def report(self) -> RevisionReport:
        statement = self.state.statement
        return RevisionReport(
            desired=self.desired,
            loaded=self.active,
            active=self.active,
            generation=self.generation,
            source=self.state.origin,
            lag_s=round(self.lag_s, 6),
            last_convergence_s=self.last_convergence_s,
            consecutive_failures=self.consecutive_failures,
            last_rejection=self.last_rejection,
            control_plane_up=self.control_plane_up if self._ever_read else None,
            last_error=self.last_error,
            sequence=self.state.sequence,
            statement=(statement.report(self._wall_clock())
                       if statement is not None else None),
            statement_age_s=(round(statement.age_s(self._wall_clock()), 3)
                             if statement is not None else None),
            upstream=self.state.upstream if self.state.upstream is not None else msgspec.UNSET,
        )

    # -- between attempts ---------------------------------------------------------

    def restarted(self) -> None:
        """A loop starts: it remembers no refusal, and re-writes the sinks of what serves.

        A restarted child cannot know whether its predecessor crashed between the swap
        and a sink (:attr:`sinks_unknown`, cleared once they are written).
        """
        self.sinks_unknown = self.state.snapshot is not None
        self._refused = None

    def is_active(self, key: Key) -> bool:
        """``key`` is what serves, and it came from the control plane."""
        return (self.active == key[0] and self.source == "control_plane"
                and self.state.body_sha256 == key[1])

    def still_refused(self, key: Key) -> Outcome | None:
        """The remembered refusal of ``key``, marked repeated; None when ``key`` was not refused.

        While desired keeps that key, the loop answers this instead of hydrating it again.
        """
        if self._refused is None or self._refused[0] != key:
            return None
        return replace(self._refused[1], repeated=True)

    def check_epoch(self, identity: str | None) -> None:
        """Note the control plane's identity (None: not told); a change starts a new epoch.

        Compared at every observe (PostgreSQL cluster and database, SQLite file). A new
        epoch is logged, re-writes the sinks from a fresh hydrate (:attr:`sinks_unknown`)
        and forgets the refusal.
        """
        if identity is None:
            return
        known, self.identity = self.identity, identity
        if known is not None and known != identity:
            log.warning(
                "control plane identity changed (a restore, or another database): new "
                "epoch; re-reading the desired revision and re-writing the sinks, and the "
                "cache's rollback mark follows what this epoch serves",
                previous=known, identity=identity,
            )
            self.sinks_unknown = True
            self._refused = None

    def remember_refusal(self, exc: LabelledError, outcome: Outcome) -> None:
        """Remember ``outcome`` when ``exc`` is final and about the current candidate.

        Final: :func:`~supervisor.convergence.outcome.is_final`. Desired moving to another
        key, a new epoch, or :meth:`forget_refusal` ends it.
        """
        candidate = self.candidate
        if is_final(exc) and candidate is not None and candidate[0] == outcome.revision:
            self._refused = (candidate, outcome)

    def forget_refusal(self) -> None:
        """The operator's "look again" (SIGHUP): the next attempt hydrates whatever is desired.

        A body repaired in place keeps its key, so only this clears its refusal.
        """
        self._refused = None
