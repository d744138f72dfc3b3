"""When the convergence loop attempts again: a pure policy, the delay given an outcome.

Polling is the correctness mechanism; the change signal (LISTEN, SIGHUP, a
LISTEN reconnect, ``POST /v1/converge``) only shortens the wait, which the
:class:`~supervisor.convergence.loop.ConvergenceLoop` runs. The delay after an
attempt (:meth:`Schedule.delay_after`, logged as ``retry_in_s``):

- success, converged, empty: ``poll_interval_s``;
- the control plane could not be asked (``unavailable``, ``conflict``): the
  backoff delay (``backoff_initial_s`` doubling to ``backoff_max_s``), reset on
  the next answer, so an outage never becomes a hot loop;
- the control plane answered and the candidate was refused: ``poll_interval_s``.

After a failed attempt the next one never starts before ``backoff_initial_s``
(:meth:`Schedule.floor_after`), even when signalled: a burst of notifications
during an outage cannot make a hot loop either.

A Schedule holds no more than the backoff's failure count; it knows nothing of
the loop, the signal or the clock.
"""

from __future__ import annotations

import random

from supervisor.backoff import Backoff
from supervisor.convergence.outcome import UNREACHED, Outcome

__all__ = ["Schedule"]


class Schedule:
    """The delays between attempts (module docstring)."""

    def __init__(self, *, poll_interval_s: float, backoff_initial_s: float,
                 backoff_max_s: float, rng: random.Random | None = None) -> None:
        self.poll_interval_s = poll_interval_s
        self.backoff = Backoff(backoff_initial_s, backoff_max_s, rng)

    def delay_after(self, outcome: Outcome) -> float:
        """The delay before the next attempt unless woken; advances or resets the backoff."""
        if outcome.failed and outcome.reason in UNREACHED:
            return self.backoff.next()
        self.backoff.reset()
        return self.poll_interval_s

    def floor_after(self, outcome: Outcome) -> float:
        """How long the next attempt waits even when woken (0.0 after a success)."""
        return self.backoff.initial_s if outcome.failed else 0.0
