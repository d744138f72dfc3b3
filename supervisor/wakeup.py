"""A re-armable wake-up: one task ends another's wait early, never blocking, never lost.

:meth:`Wakeup.wake` ends every :meth:`Wakeup.wait` in progress, counts itself
(:attr:`Wakeup.count`) and re-arms for the next waits; it never blocks and
never waits for an answer. A waiter says which wake-ups it has seen: ``wait(timeout_s,
since=n)`` returns True at once when :attr:`~Wakeup.count` has moved on from
``n``, so a wake-up that came while it was not waiting (during the attempt or
probe before its wait) is not lost. A waiter reads the count before that work,
or keeps the count its last woken wait saw: either way nothing is missed.

The daemon owns each one, so it outlives restarts of the children on either
side: the convergence loop wakes the LISTEN child when the control plane stops
or starts answering (a reconnect or a probe at once), and SIGHUP wakes every
waiting fan-out preflight (a retry at once).
It sits at the bottom of the package: it imports nothing of ours.
"""

from __future__ import annotations

import trio

__all__ = ["Wakeup"]


class Wakeup:
    def __init__(self) -> None:
        self._event = trio.Event()
        self.count = 0

    def wake(self) -> None:
        """End every wait in progress, and every later one that says it has not seen this."""
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
