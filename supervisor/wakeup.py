"""A re-armable wake-up: one task ends another's wait early, never blocking, never lost.

It sits at the bottom of the package: it imports nothing of ours.
"""

from __future__ import annotations

import trio

__all__ = ["Wakeup"]


class Wakeup:
    """One task's :meth:`wake` ends another's :meth:`wait`; a wake-up between waits is not lost.

    A waiter says which wake-ups it has seen: ``wait(timeout_s, since=n)`` returns at
    once when :attr:`count` moved on from ``n``. It reads the count before its work
    (the attempt or probe before the wait), or keeps the one its last woken wait saw.

    The daemon owns each one, so it outlives restarts of the children on either side.
    The convergence loop wakes the LISTEN child when the control plane stops or starts
    answering; SIGHUP wakes every waiting fan-out preflight; a swap wakes the reload hook.
    """
    def __init__(self) -> None:
        self._event = trio.Event()
        self.count = 0

    def wake(self) -> None:
        """End every wait in progress, and every later one that says it has not seen this.

        Counts itself (:attr:`count`) and re-arms; never blocks, never waits for an answer.
        """
        self.count += 1
        self._event.set()
        self._event = trio.Event()

    async def wait(self, timeout_s: float, *, since: int) -> bool:
        """Wait up to ``timeout_s``; True when woken, at once if :attr:`count` is not ``since``."""
        if self.count != since:
            return True
        event = self._event
        with trio.move_on_after(timeout_s):
            await event.wait()
            return True
        return False
