"""The control plane as the loop and the commands see it: two protocols and their records.

:class:`RevisionSource` is what the loop reads; :class:`RevisionAdmin` adds the commands'
revision lifecycle. :mod:`.factory` opens either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from supervisor.controlplane.migrations import Migrated
    from supervisor.sinks.lkg.statement import Statement
    from supervisor.sinks.state import Candidate

__all__ = ["DesiredChange", "LoadedRevision", "RevisionAdmin", "RevisionPointer",
           "RevisionSource", "RevisionSummary"]


@dataclass(frozen=True)
class LoadedRevision:
    """One stored revision as ``show`` and ``rollback`` read it, its body checked against
    its digest (identity as in :class:`~supervisor.sinks.state.Candidate`)."""

    id: int
    schema_version: int
    body: bytes = field(repr=False)
    created_at: datetime
    message: str | None
    body_sha256: bytes = b""


@dataclass(frozen=True)
class RevisionPointer:
    """What the cheap observe read learns: the desired revision and who said so.

    ``body_sha256`` is None when the pointer names a missing revision.
    ``sequence`` counts the changes of the pointer (publishes, rollbacks,
    plain SQL): a rollback is an older id under a higher sequence.
    ``identity`` names the control plane itself (PostgreSQL: system identifier
    and database oid; SQLite: the file's device and inode); a change means a
    restore or another database, and starts a new epoch in the loop.
    """

    revision: int
    body_sha256: bytes | None
    identity: str | None = None
    #: ``supervisor_desired.sequence``: grows at every change of the pointer.
    sequence: int | None = None
    #: Follower mode: the root's signed statement (see Candidate.statement).
    statement: Statement | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RevisionSummary:
    """One row of ``history``: everything but the body."""

    id: int
    schema_version: int
    size: int
    body_sha256: bytes
    created_at: datetime | None
    message: str | None


@dataclass(frozen=True)
class DesiredChange:
    """One row of ``supervisor_desired_log``: a change of the desired pointer."""

    sequence: int
    revision_id: int
    changed_at: datetime | None
    changed_by: str
    message: str | None


class RevisionSource(Protocol):
    """What the convergence loop reads; the databases and the follower implement it.

    Raises :class:`~supervisor.controlplane.errors.ControlPlaneError`. Not connected
    when made: the first call connects, and the next call remakes a failed connection.
    """

    async def observe(self) -> RevisionPointer | None:
        """The desired revision's id and digest, and the control plane's identity.

        None when nothing was ever published. The cheap read of every poll: its success
        proves the control plane reachable. The digest comes too: an id alone is not the
        revision (:class:`~supervisor.sinks.state.Candidate`).
        """

    async def hydrate(self) -> Candidate | None:
        """One consistent read of the desired pointer and the revision it names.

        None when nothing is desired. Raises NOT_FOUND, TooLarge, Incompatible
        or CORRUPT (checked in that order) about the revision it read.
        """

    async def aclose(self) -> None:
        """Close the connection; the source may not be used afterwards."""


class RevisionAdmin(RevisionSource, Protocol):
    """The revision lifecycle the commands use, on a database (never a follower).

    Both databases implement it alike (:class:`~supervisor.controlplane.revisions.DatabaseStore`).
    """

    async def desired(self) -> int | None:
        """The desired revision id, or None when nothing was ever published."""

    async def publish(self, body: bytes, schema_version: int, message: str | None) -> int:
        """Store a revision and make it desired in one transaction; return its id.

        The digest is computed here. Refuses (nothing stored) a body over
        ``max_revision_bytes`` (TooLarge) and a ``schema_version`` this build
        does not read (Incompatible), since no replica of it could load them.
        """

    async def migrate(self) -> Migrated:
        """Create or upgrade the schema; versioned and idempotent; say what was done.

        Raises SchemaTooNew (nothing changed) when a newer build migrated it.
        """

    async def history(self, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        """(desired id, the newest ``limit`` revisions newest first, without bodies).

        All when ``limit`` is None; the desired id is read in the same statement.
        """

    async def revision(self, revision: int) -> LoadedRevision:
        """One revision, its body checked against its digest; NOT_FOUND, TooLarge, CORRUPT.

        ``schema_version`` is returned as stored: the caller decides what it reads.
        """

    async def rollback(self, revision: int, body_sha256: bytes,
                       message: str | None = None) -> int | None:
        """Point desired at ``revision`` if it still exists with this digest (else NOT_FOUND).

        ``message`` is recorded with the change (``supervisor_desired_log``).
        Returns the desired id this replaced (None: none was desired), read in
        the same transaction as the write, so a publish racing the rollback is named.
        One statement: a revision pruned or replaced meanwhile is NOT_FOUND, never a
        dangling or different pointer. On PostgreSQL the trigger notifies at commit.
        """

    async def prune(self, keep: int) -> list[int]:
        """Delete revisions older than the newest ``keep``, never the desired one; their ids.

        One transaction. The desired row is locked first, so a concurrent rollback or
        publish waits rather than losing its revision.
        """

    async def changes(self, limit: int | None) -> list[DesiredChange]:
        """The newest ``limit`` changes of the desired pointer (all when None), newest first."""
