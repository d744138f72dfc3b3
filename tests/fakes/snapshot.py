"""A stand-in for the served snapshot with what the admin API reads, and serving it.

``revision``, ``generation``, ``to_json()`` and ``etag()``: the admin API's
tests serve it without compiling a revision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from supervisor.sinks.lkg.statement import Statement
from supervisor.sinks.state import ActiveState, Candidate, Serving, Source


@dataclass(frozen=True)
class FakeSnapshot:
    revision: int
    generation: int
    aliases: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return msgspec.json.encode(
            {"revision": self.revision, "generation": self.generation,
             "aliases": self.aliases, "keys": self.keys}
        )

    def etag(self) -> str:
        return f'"{self.revision}-{self.generation}"'


def serve(state: ActiveState, snapshot: Any, *, source: Source = "control_plane",
          body_sha256: bytes = b"", statement: Statement | None = None,
          sequence: int | None = None, body: bytes = b"{}") -> None:
    """Serve ``snapshot`` in ``state`` as the loop would, from a candidate built around it."""
    candidate = Candidate(snapshot.revision, body_sha256, body, 1, sequence, None)
    state.serve(Serving(snapshot, candidate, source, statement))


def restate(state: ActiveState, statement: Statement | None) -> None:
    """What serves, under ``statement`` (re-signed, or a fresher one passed on)."""
    assert state.serving is not None
    state.serve(state.serving.restated(statement, None))
