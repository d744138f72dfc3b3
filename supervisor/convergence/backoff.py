"""Bounded exponential backoff with jitter.

``next()`` returns ``initial * 2**n`` (n = failures so far) capped at ``maximum``,
scaled by a uniform jitter in [0.5, 1.0] ("equal jitter": never below half the
nominal delay, so an outage never becomes a hot loop, and replicas failing
together spread out). ``reset()`` after a success.
"""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    def __init__(
        self, initial_s: float, maximum_s: float, rng: random.Random | None = None
    ) -> None:
        if initial_s <= 0 or maximum_s < initial_s:
            raise ValueError(f"invalid backoff bounds {initial_s}..{maximum_s}")
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self.failures = 0
        self._rng = rng or random.Random()

    def nominal(self) -> float:
        """The next delay before jitter."""
        return min(self.maximum_s, self.initial_s * 2.0 ** min(self.failures, 64))

    def next(self) -> float:
        delay = self.nominal() * self._rng.uniform(0.5, 1.0)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
