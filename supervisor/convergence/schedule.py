"""When the convergence loop attempts again: :class:`Schedule`, a pure policy."""

from __future__ import annotations

import random

from supervisor.backoff import Backoff
from supervisor.convergence.outcome import UNREACHED, Outcome

__all__ = ["Schedule"]


class Schedule:
    """The delays between attempts; it holds only the backoff's failure count.

    Polling is the correctness path. The change signal (LISTEN, SIGHUP,
    ``POST /v1/converge``) only shortens the wait, which the loop runs. It knows
    nothing of the loop, the signal or the clock.
    """

    def __init__(self, *, poll_interval_s: float, backoff_initial_s: float,
                 backoff_max_s: float, rng: random.Random | None = None) -> None:
        self.poll_interval_s = poll_interval_s
        self.backoff = Backoff(backoff_initial_s, backoff_max_s, rng)

    def delay_after(self, outcome: Outcome) -> float:
        """The delay before the next attempt unless woken (``retry_in_s``).

        The control plane could not be asked (``unavailable``, ``conflict``): the
        backoff, ``backoff_initial_s`` doubling to ``backoff_max_s``, reset at the next
        answer. So an outage never becomes a hot loop. Anything else (success, empty,
        a refusal): ``poll_interval_s``.
        """
        if outcome.failed and outcome.reason in UNREACHED:
            return self.backoff.next()
        self.backoff.reset()
        return self.poll_interval_s

    def floor_after(self, outcome: Outcome) -> float:
        """How long the next attempt waits even when woken (0.0 after a success).

        ``backoff_initial_s`` after a failure: a burst of notifications during an
        outage cannot make a hot loop either.
        """
        return self.backoff.initial_s if outcome.failed else 0.0
