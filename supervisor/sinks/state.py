"""The in-memory active snapshot: what the admin API and local readers serve.

Publishing is one attribute assignment: a reader that took :attr:`ActiveState.snapshot`
keeps the object it holds (snapshots are immutable), and every reader after the
swap sees the new one. Nothing here can half-apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from supervisor.revision.snapshot import Snapshot

__all__ = ["ActiveState"]


class ActiveState:
    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._first = trio.Event()

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    @property
    def generation(self) -> int:
        return 0 if self._snapshot is None else self._snapshot.generation

    def publish(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._first.set()

    async def wait_first(self) -> None:
        await self._first.wait()
