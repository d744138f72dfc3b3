"""The in-memory active snapshot: what the admin API and local readers serve.

Swapping is one attribute assignment: a reader that took :attr:`ActiveState.snapshot`
keeps the object it holds (snapshots are immutable), and every reader after the
swap sees the new one. Nothing here can half-apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from supervisor.revision.snapshot import Snapshot
    from supervisor.sinks.lkg.statement import Statement

__all__ = ["ActiveState"]


class ActiveState:
    """The serving snapshot and the SHA-256 of the body it was compiled from.

    The digest is the snapshot's identity next to its revision id: after a
    restore an id can come back with another body, and "already converged"
    must mean same id *and* same content.
    """

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self.body_sha256: bytes | None = None
        #: The signed statement serving with it (None: none signed, a version 1
        #: cache): what ``GET /v1/revision`` serves and derives its ETag from.
        #: Replaced without a swap when the root re-signs the same revision.
        self.statement: Statement | None = None

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    @property
    def generation(self) -> int:
        return 0 if self._snapshot is None else self._snapshot.generation

    def swap(self, snapshot: Snapshot, *, body_sha256: bytes | None = None,
             statement: Statement | None = None) -> None:
        """Serve ``snapshot`` from now on (the one atomic swap)."""
        self._snapshot = snapshot
        self.body_sha256 = body_sha256
        self.statement = statement
