"""What serves: the candidate a source hands the loop, the serving record, and its one holder.

A :class:`Candidate` becomes a :class:`Serving` once compiled; :class:`ActiveState`
holds the serving record and swaps it by one assignment. Admin, status and
sinks read it; nobody keeps a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from supervisor.revision.snapshot import Snapshot
    from supervisor.sinks.lkg.statement import Statement

__all__ = ["ActiveState", "Candidate", "Serving", "Source"]

Source = Literal["control_plane", "last_known_good"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A complete revision as its source read it, its body verified against its digest.

    A revision is its content: after a restore from a backup an id may come
    back with another body, so "the same revision" means the same ``id`` and
    the same ``body_sha256`` (computed once, where the revision is read).
    ``sequence`` counts the root's changes of the desired pointer (None: not
    read). ``statement`` is the root's signed statement a follower received
    (its bytes passed on unchanged); None from a database.
    """

    id: int
    body_sha256: bytes
    body: bytes = field(repr=False)
    schema_version: int
    sequence: int | None = None
    statement: Statement | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Serving:
    """A compiled candidate as it serves: handed whole to every sink.

    ``statement`` is what it serves under: the root's own (signed here), the
    root's passed on by a follower, or None (nothing to sign with).
    """

    snapshot: Snapshot
    candidate: Candidate
    source: Source = "control_plane"
    statement: Statement | None = None

    @property
    def revision(self) -> int:
        return self.snapshot.revision

    @property
    def generation(self) -> int:
        return self.snapshot.generation

    @property
    def sequence(self) -> int | None:
        """The root's sequence it serves under: the statement's, else the candidate's."""
        return self.candidate.sequence if self.statement is None else self.statement.sequence

    def restated(self, statement: Statement | None, sequence: int | None) -> Serving:
        """The same snapshot under a fresher ``statement`` or a new ``sequence``."""
        candidate = self.candidate
        if sequence is not None and sequence != candidate.sequence:
            candidate = replace(candidate, sequence=sequence)
        return replace(self, candidate=candidate, statement=statement)


class ActiveState:
    """The one holder of what serves; :meth:`serve` swaps it by one assignment.

    A reader that took :attr:`snapshot` keeps the object it holds (snapshots
    are immutable); every reader after the swap sees the new one.
    """

    def __init__(self, upstream: str | None = None) -> None:
        #: Follower mode: the upstream replica's address (``[control_plane].url``); None
        #: on a replica that reads a database.
        self.upstream = upstream
        self.serving: Serving | None = None

    def serve(self, serving: Serving) -> None:
        """Serve ``serving`` from now on (the one atomic swap)."""
        self.serving = serving

    @property
    def snapshot(self) -> Snapshot | None:
        return None if self.serving is None else self.serving.snapshot

    @property
    def source(self) -> Source | None:
        return None if self.serving is None else self.serving.source

    @property
    def body_sha256(self) -> bytes | None:
        return None if self.serving is None else self.serving.candidate.body_sha256

    @property
    def statement(self) -> Statement | None:
        """What ``GET /v1/revision`` serves and derives its ETag from (None: unsigned)."""
        return None if self.serving is None else self.serving.statement

    @property
    def sequence(self) -> int | None:
        return None if self.serving is None else self.serving.sequence

    @property
    def origin(self) -> str | None:
        """Where what serves came from, as ``/status``, events and logs tell it.

        A follower names its upstream's address in place of ``control_plane``.
        """
        if self.upstream is not None and self.source == "control_plane":
            return self.upstream
        return self.source

    @property
    def generation(self) -> int:
        return 0 if self.serving is None else self.serving.generation
