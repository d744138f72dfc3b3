"""Bounded exponential backoff with jitter: the one every retry loop uses.

It sits at the bottom of the package: it imports nothing of ours.
"""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    """Delays of ``initial_s * 2**n`` (n: failures so far), capped at ``maximum_s``, then jittered.

    The jitter is a uniform factor in ``jitter``. The default [0.5, 1.0] ("equal jitter")
    never goes below half the nominal delay. So an outage never becomes a hot loop, and
    replicas failing together spread out. ``(1.0, 1.0)``: no jitter.

    :meth:`next` counts a failure; :meth:`reset` after a success. :meth:`after` is the
    same delay for a count kept elsewhere (per key, or within a window). Both take
    ``at_least``, a floor such as a 429's ``Retry-After``.
    """
    def __init__(
        self,
        initial_s: float,
        maximum_s: float,
        rng: random.Random | None = None,
        *,
        jitter: tuple[float, float] = (0.5, 1.0),
    ) -> None:
        if initial_s <= 0 or maximum_s < initial_s:
            raise ValueError(f"invalid backoff bounds {initial_s}..{maximum_s}")
        if not 0 < jitter[0] <= jitter[1]:
            raise ValueError(f"invalid jitter {jitter}")
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self.jitter = jitter
        self.failures = 0
        self._rng = rng or random.Random()

    def after(self, failures: int, *, at_least: float | None = None) -> float:
        """The jittered delay after ``failures`` failures, never under ``at_least``
        (state untouched)."""
        nominal = min(self.maximum_s, self.initial_s * 2.0 ** min(max(failures, 0), 64))
        delay = nominal * self._rng.uniform(*self.jitter)
        return delay if at_least is None else max(delay, at_least)

    def next(self, *, at_least: float | None = None) -> float:
        """The delay after one more failure (counted), never under ``at_least``."""
        delay = self.after(self.failures, at_least=at_least)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
