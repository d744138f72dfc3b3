"""A client-side token bucket for API requests, as client-go's QPS and Burst.

Contract: :meth:`TokenBucket.acquire` returns at once while tokens are left
(up to ``burst`` stored), then paces callers at ``qps`` a second, in the
order they asked (a trio.Lock is fair: FIFO). It never fails: a caller that
is cancelled while waiting gives its turn up. Time is trio's clock, so tests
on a MockClock see virtual waits.
"""

from __future__ import annotations

import trio

__all__ = ["TokenBucket"]


class TokenBucket:
    """``qps`` tokens a second, at most ``burst`` stored; starts full."""

    def __init__(self, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._stamp: float | None = None
        self._lock = trio.Lock()
        self.waited_s = 0.0  # total time callers spent waiting (for tests and metrics)

    def _refill(self) -> None:
        now = trio.current_time()
        if self._stamp is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now

    async def acquire(self) -> None:
        """Take one token, waiting for it when the bucket is empty."""
        async with self._lock:
            self._refill()
            if self._tokens < 1.0:
                wait = (1.0 - self._tokens) / self.qps
                self.waited_s += wait
                await trio.sleep(wait)
                self._refill()
            self._tokens -= 1.0
