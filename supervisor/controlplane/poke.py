"""A nudge from one child to another that never blocks and never waits for an answer.

The convergence loop pokes the LISTEN child when the control plane stops or
starts answering: a listener sleeping in its reconnect backoff reconnects at
once (its backoff reset), and a connected one probes its connection at once
instead of at its next probe deadline. The daemon owns the :class:`Poke`, so it
survives restarts of either child.
"""

from __future__ import annotations

import trio

__all__ = ["Poke"]


class Poke:
    def __init__(self) -> None:
        self._event = trio.Event()
        self.count = 0

    def poke(self) -> None:
        """Wake whoever waits now, or the next waiter at once. Never blocks."""
        self.count += 1
        self._event.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a poke; True when poked (the poke is consumed)."""
        with trio.move_on_after(timeout_s):
            await self._event.wait()
        if self._event.is_set():
            self._event = trio.Event()
            return True
        return False
