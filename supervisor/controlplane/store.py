"""The control-plane store: what the convergence loop reads, and how it fails.

Contract (docs/control-plane.md): the control plane holds immutable revisions
(``supervisor_revisions``) and one pointer to the desired one
(``supervisor_desired``). A store offers exactly the reads the convergence loop
needs (:meth:`ControlPlaneStore.desired`, the cheap liveness-proving read, and
:meth:`ControlPlaneStore.hydrate`, one consistent read of the complete desired
revision), :meth:`~ControlPlaneStore.publish` for the CLI, and
:meth:`~ControlPlaneStore.migrate`. Three implementations exist:
:mod:`supervisor.controlplane.postgres`, :mod:`supervisor.controlplane.sqlite`
and, in follower mode, :mod:`supervisor.controlplane.follower` (another
replica's signed ``/v1/revision``; it refuses ``publish`` and ``migrate``);
:func:`~supervisor.controlplane.factory.open_store` picks one from the URL and
never connects by itself (the first call does, and a failed connection is
re-made on the next call).

How stores fail is drawn in :mod:`supervisor.controlplane.errors`; the
checks both databases run in :mod:`supervisor.controlplane.checks`; the
connection lifecycle they share in :mod:`supervisor.controlplane.runner`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from supervisor.controlplane.migrations import Migrated
    from supervisor.sinks.lkg.statement import Statement

__all__ = ["ControlPlaneStore", "DesiredChange", "LoadedRevision", "RevisionPointer",
           "RevisionSummary"]


@dataclass(frozen=True)
class LoadedRevision:
    """A complete revision as stored: the body is verified against its digest, not decoded.

    ``body_sha256`` is part of the revision's identity: after a restore from a
    backup an id may be reused for another body, so "the same revision" means
    the same id *and* the same digest.
    """

    id: int
    schema_version: int
    body: bytes = field(repr=False)
    created_at: datetime
    message: str | None
    body_sha256: bytes = b""
    #: ``supervisor_desired.sequence`` read with the pointer (None: not read
    #: with it, as by ``revision``): the root's intent, which grows at every
    #: change of the pointer, rollbacks included.
    sequence: int | None = None
    #: Follower mode: the root's signed statement it came with (its bytes kept,
    #: to be passed on unchanged); None from a database.
    statement: Statement | None = field(default=None, compare=False)


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
    #: Follower mode: the root's signed statement (see LoadedRevision.statement).
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


class ControlPlaneStore(Protocol):
    """What the daemon and the CLI need from a control plane. Raises ControlPlaneError."""

    async def desired(self) -> int | None:
        """The desired revision id, or None when nothing was ever published.

        The cheap read the loop makes every poll; its success is what proves
        the control plane reachable.
        """
        ...

    async def observe(self) -> RevisionPointer | None:
        """The desired revision's id, body digest and the control plane's identity.

        As cheap as :meth:`desired` (one indexed join, 32 bytes more), and what
        the loop polls: an id alone cannot tell a reused id from the revision
        it replaced.
        """
        ...

    async def hydrate(self) -> LoadedRevision | None:
        """One consistent read of the desired pointer and the revision it names.

        None when nothing is desired. Raises NOT_FOUND, TooLarge, Incompatible
        or CORRUPT (in that order of checks) about the revision it read.
        """
        ...

    async def publish(self, body: bytes, schema_version: int, message: str | None) -> int:
        """Store a revision and make it desired in one transaction; return its id.

        The digest is computed here. Refuses (nothing stored) a body over
        ``max_revision_bytes`` (TooLarge) and a ``schema_version`` this build
        does not read (Incompatible), since no replica of it could load them.
        """
        ...

    async def migrate(self) -> Migrated:
        """Create or upgrade the schema; versioned and idempotent; say what was done.

        Raises SchemaTooNew (nothing changed) when a newer build migrated it.
        """
        ...

    # -- the revision lifecycle (statements in controlplane.revisions) --

    async def history(self, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        """(desired id, the newest ``limit`` revisions newest first, without bodies)."""
        ...

    async def revision(self, revision: int) -> LoadedRevision:
        """One revision, its body checked against its digest; NOT_FOUND, TooLarge, CORRUPT.

        ``schema_version`` is returned as stored: the caller decides what it reads.
        """
        ...

    async def rollback(self, revision: int, body_sha256: bytes,
                       message: str | None = None) -> int | None:
        """Point desired at ``revision`` if it still exists with this digest (else NOT_FOUND).

        ``message`` is recorded with the change (``supervisor_desired_log``).

        Returns the desired id this replaced (None: none was desired), read in the
        same transaction as the write, so a publish racing the rollback is named.
        """
        ...

    async def prune(self, keep: int) -> list[int]:
        """Delete revisions older than the newest ``keep``, never the desired one; their ids."""
        ...

    async def changes(self, limit: int | None) -> list[DesiredChange]:
        """The newest ``limit`` changes of the desired pointer (all when None), newest first."""
        ...

    async def aclose(self) -> None:
        """Close the connection; the store may not be used afterwards."""
        ...
