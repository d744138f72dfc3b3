"""When the convergence loop attempts again: the poll, the backoff, and the wake-ups.

Polling is the correctness mechanism; the :class:`ChangeSignal` (LISTEN,
SIGHUP, a LISTEN reconnect, ``POST /v1/converge``) only shortens the wait.
Delays after an attempt (:meth:`Schedule.delay_after`, carried by the outcome
as ``retry_in_s``):

- success, converged, empty: ``poll_interval_s``;
- the control plane could not be asked (``unavailable``, ``conflict``): the
  backoff delay (``backoff_initial_s`` doubling to ``backoff_max_s``), reset on
  the next answer, so an outage never becomes a hot loop;
- the control plane answered and the candidate was refused: ``poll_interval_s``.

After a failed attempt the next one never starts before ``backoff_initial_s``
(the floor), even when signalled: a burst of notifications during an outage
cannot make a hot loop either. A wake-up that came during the floor is taken
even when the delay has passed too (a poll interval shorter than the floor),
so its trigger (SIGHUP's "look again") is never lost.

Every wake-up taken off the change signal is answered (``POST /v1/converge``
waits on it) once the attempt that consumed it has finished, also when that
attempt was interrupted (:meth:`Schedule.run`). A wake-up that arrives while
an attempt runs is kept for the next one, not cleared: it may concern
something the running attempt did not see.

A Schedule holds no more than the backoff's failure count; the
:class:`~supervisor.convergence.loop.ConvergenceLoop` that owns it makes the
attempts.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import NoReturn

import trio

from supervisor.backoff import Backoff
from supervisor.convergence.outcome import UNREACHED, Outcome, answer_for
from supervisor.convergence.signal import ChangeSignal, WakeupBatch

__all__ = ["Schedule"]


class Schedule:
    """The delays between attempts and the wait that a wake-up cuts short (module docstring)."""

    def __init__(
        self,
        signal: ChangeSignal,
        *,
        poll_interval_s: float,
        backoff_initial_s: float,
        backoff_max_s: float,
        rng: random.Random | None = None,
    ) -> None:
        self.signal = signal
        self.poll_interval_s = poll_interval_s
        self.backoff = Backoff(backoff_initial_s, backoff_max_s, rng)

    def delay_after(self, outcome: Outcome) -> float:
        """The delay before the next attempt; advances or resets the backoff."""
        if outcome.failed and outcome.reason in UNREACHED:
            return self.backoff.next()
        self.backoff.reset()
        return self.poll_interval_s

    async def run(self, attempt: Callable[[str], Awaitable[Outcome]]) -> NoReturn:
        """Call ``attempt(trigger)`` forever, waiting its outcome's ``retry_in_s`` in between.

        The first attempt's trigger is ``poll``; every later one's is the
        wake-up's that ended the wait (``poll`` when none came). ``attempt``
        returns an outcome with ``retry_in_s`` set (from :meth:`delay_after`).
        """
        wakeup = WakeupBatch("poll")
        while True:
            # A wake-up that arrived while the attempt ran may concern something
            # the attempt did not see, so it is kept, not cleared.
            outcome: Outcome | None = None
            try:
                outcome = await attempt(wakeup.trigger)
            finally:
                wakeup.resolve(answer_for(outcome))
            assert outcome.retry_in_s is not None
            floor = self.backoff.initial_s if outcome.failed else 0.0
            wakeup = await self.wait(outcome.retry_in_s, floor)

    async def wait(self, delay: float, floor: float) -> WakeupBatch:
        """Sleep ``delay`` unless signalled; never wake before ``floor``."""
        deadline = trio.current_time() + delay
        if floor > 0:
            await trio.sleep(floor)
        # A wake-up that came during the floor is taken even when the deadline
        # has passed too (a poll interval shorter than the floor): otherwise it
        # would sit in the channel, never consumed, and its trigger (SIGHUP's
        # "look again") would be lost.
        woken = self.signal.pending()
        if woken is not None:
            return woken
        with trio.move_on_at(deadline):
            return await self.signal.next_wakeup()
        return WakeupBatch("poll")
