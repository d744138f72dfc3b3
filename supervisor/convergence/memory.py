"""What the convergence loop remembers between attempts: :class:`RevisionMemory`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from supervisor.convergence.outcome import Key, Outcome, is_final
from supervisor.logs import get_logger

if TYPE_CHECKING:
    from supervisor.convergence.status import RevisionStatus
    from supervisor.errors import LabelledError

__all__ = ["RevisionMemory"]

log = get_logger("convergence")


class RevisionMemory:
    """Which revision was refused for good, and the control plane's epoch.

    Revisions are known by :data:`~supervisor.convergence.outcome.Key`, id and body
    digest (why: :class:`~supervisor.sinks.state.Candidate`). What serves is read from
    the status's :class:`~supervisor.sinks.state.ActiveState`. :attr:`sinks_unknown`
    starts True when a snapshot already serves: a restarted child cannot know whether
    its predecessor crashed between the swap and a sink. The loop re-writes the sinks
    at its first attempt and clears it. One loop (one task) owns it: no lock.
    """

    def __init__(self, status: RevisionStatus) -> None:
        self.state = status.state
        self.status = status
        # A restarted child cannot know whether its predecessor crashed between
        # the swap and a sink: re-write the sinks at the first attempt.
        self.sinks_unknown = self.state.snapshot is not None
        # The revision refused for a reason only a new body can change.
        self._refused: tuple[Key, Outcome] | None = None
        # The revision the current attempt is about (for the refusal memo).
        self.candidate: Key | None = None

    def is_active(self, key: Key) -> bool:
        """``key`` is what serves, and it came from the control plane."""
        snapshot = self.state.snapshot
        return (
            snapshot is not None
            and self.state.source == "control_plane"
            and snapshot.revision == key[0]
            and self.state.body_sha256 == key[1]
        )

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
        known = self.status.identity
        self.status.identity = identity
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
