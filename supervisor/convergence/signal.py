"""The change signal: a hint that desired state may have changed.

Senders (the LISTEN child, SIGHUP, a reconnect) call :meth:`ChangeSignal.notify`,
which never blocks and never fails. The channel holds at most one pending
wake-up, so a burst of notifications coalesces into one convergence attempt.
Nothing is carried but the trigger's name: the payload is only a hint, and a
lost signal costs at most one poll interval, because polling is the
correctness path.
"""

from __future__ import annotations

import trio

__all__ = ["ChangeSignal"]


class ChangeSignal:
    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[str](1)
        self.sent = 0
        self.coalesced = 0

    def notify(self, trigger: str = "notify") -> None:
        """Wake the loop now instead of at its next poll. Never blocks."""
        try:
            self._send.send_nowait(trigger)
            self.sent += 1
        except trio.WouldBlock:
            self.coalesced += 1

    def pending(self) -> str | None:
        """Take the pending wake-up's trigger without waiting; None when there is none."""
        try:
            return self._receive.receive_nowait()
        except trio.WouldBlock:
            return None

    async def wait(self) -> str:
        """Wait for the next wake-up; return the trigger of the first one pending."""
        return await self._receive.receive()

    def clear(self) -> None:
        """Drop a pending wake-up (an attempt that just ran has already seen it)."""
        try:
            self._receive.receive_nowait()
        except trio.WouldBlock:
            pass
