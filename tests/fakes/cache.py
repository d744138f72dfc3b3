"""A stand-in for the signed cache with the surface the convergence loop uses.

It records what was served at each export, and ``fail`` makes exports fail as a
full disk would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.sinks.lkg import CacheUnwritable

__all__ = ["FakeCache"]


@dataclass
class FakeCache:
    """The cache's surface as the loop uses it; records what was served at each export."""

    state_at_export: Callable[[], int | None]
    path: str
    fail: bool = False
    revision: int | None = None
    exported: list[tuple[int, int | None]] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    forgotten: int = 0
    # No signing key: the loop signs no statement (a version 1 export).
    signing_key_id: str | None = None

    def export(self, *, revision: int, generation: int, schema_version: int,
               body: bytes, statement: object = None, body_sha256: bytes = b"") -> None:
        if self.fail:
            raise CacheUnwritable(self.path, "No space left on device")
        self.exported.append((revision, self.state_at_export()))
        self.revision = revision
        Path(self.path).write_bytes(body)

    @property
    def paths(self) -> tuple[str]:
        return (self.path,)

    def forget_files(self) -> None:
        self.forgotten += 1

    def discard_if_newer(self, revision: int, body_sha256: bytes | None = None) -> bool:
        if self.revision is not None and self.revision > revision:
            self.discarded.append(self.revision)
            self.revision = None
            Path(self.path).unlink()
            return True
        return False
