"""The in-memory active snapshot: what the admin API, local readers and the status serve.

Swapping is one attribute assignment: a reader that took :attr:`ActiveState.snapshot`
keeps the object it holds (snapshots are immutable), and every reader after the
swap sees the new one. Nothing here can half-apply.

This is the one place the serving revision is kept: its snapshot, where it came
from, its body digest, and the signed statement and sequence it serves under.
The convergence status and memory read it; they keep no copy. Where it came
from is told as :attr:`ActiveState.origin` everywhere (``/status``, the
stream's events, the STATUS= line, the log): in follower mode the upstream's
address in place of ``control_plane``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from supervisor.revision.snapshot import Snapshot
    from supervisor.sinks.lkg.statement import Statement

__all__ = ["ActiveState", "Source"]

Source = Literal["control_plane", "last_known_good"]


class ActiveState:
    """The serving snapshot, its source, and the SHA-256 of the body it was compiled from.

    The digest is the snapshot's identity next to its revision id: after a
    restore an id can come back with another body, and "already converged"
    must mean same id *and* same content.
    """

    def __init__(self, upstream: str | None = None) -> None:
        #: Follower mode: the upstream replica's address (``[control_plane].url``); None
        #: on a replica that reads a database.
        self.upstream = upstream
        self._snapshot: Snapshot | None = None
        #: Where the serving snapshot came from (None: nothing serving).
        self.source: Source | None = None
        self.body_sha256: bytes | None = None
        #: The signed statement serving with it (None: none signed, a version 1
        #: cache): what ``GET /v1/revision`` serves and derives its ETag from.
        #: Replaced without a swap when the root re-signs the same revision.
        self.statement: Statement | None = None
        #: The root's desired-state sequence of what serves (None: unknown).
        self.sequence: int | None = None

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    @property
    def origin(self) -> str | None:
        """Where what serves came from, as reported: :attr:`source`, but a follower names
        its upstream's address for what the upstream sent (``last_known_good`` and None
        as they are)."""
        if self.upstream is not None and self.source == "control_plane":
            return self.upstream
        return self.source

    @property
    def generation(self) -> int:
        return 0 if self._snapshot is None else self._snapshot.generation

    def swap(self, snapshot: Snapshot, *, source: Source = "control_plane",
             body_sha256: bytes | None = None, statement: Statement | None = None,
             sequence: int | None = None) -> None:
        """Serve ``snapshot`` from now on (the one atomic swap).

        ``sequence`` counts when there is no statement (which names its own).
        """
        self._snapshot = snapshot
        self.source = source
        self.body_sha256 = body_sha256
        self.statement = statement
        self.sequence = statement.sequence if statement is not None else sequence

    def restate(self, statement: Statement | None) -> None:
        """The same snapshot serves under ``statement`` (re-signed, or a fresher one passed on)."""
        self.statement = statement
        if statement is not None:
            self.sequence = statement.sequence
