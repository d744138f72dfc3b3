"""A stand-in for the served snapshot with what the admin API reads.

``revision``, ``generation``, ``to_json()`` and ``etag()``: the admin API's
tests serve it without compiling a revision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec


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
