"""How often one child may be repaired: a fight with another writer must not become a hot loop.

Something else that keeps changing a child (another controller, a second
installation whose parent has the same name, an admission webhook rewriting a
field we set) would otherwise meet a repair within milliseconds, every time,
forever. Contract of :meth:`RepairLimiter.delay`: the first ``burst`` repairs
of one child within ``window_s`` go at once; beyond that each further repair
waits 1 s, 2 s, 4 s ... after the previous one, up to ``max_s``. The caller
requeues the parent after that delay, logs the fight once and reports the
parent not ready (``RepairDeferred``) until the repair is made.
:meth:`RepairLimiter.not_before` is the same answer as a point in time
(``trio.current_time()``'s clock): it stays the same while the repair waits,
so a status naming it is not rewritten by every reconcile meanwhile.

Only a repair that was *made* (its write succeeded) is recorded: a write the
server refused or never answered (the apps namespace terminating, a 5xx, a
timeout) changed nothing, so the next attempt is not a fight; it has its own
backoff (the engine's requeue).
"""

from __future__ import annotations

from collections.abc import Hashable

from supervisor.backoff import Backoff

__all__ = ["RepairLimiter"]


class RepairLimiter:
    def __init__(self, burst: int = 3, window_s: float = 60.0, max_s: float = 60.0) -> None:
        self.burst = burst
        self.window_s = window_s
        # The wait grows with the repairs inside the window, as the supervision
        # tree's restarts grow with the crashes inside its period; no jitter: the
        # status names the time (see not_before).
        self._wait = Backoff(1.0, max_s, jitter=(1.0, 1.0))
        self._times: dict[Hashable, list[float]] = {}

    def delay(self, key: Hashable, now: float) -> float:
        """Seconds until ``key`` may be repaired again (0: now)."""
        return max(0.0, self.not_before(key, now) - now)

    def not_before(self, key: Hashable, now: float) -> float:
        """When ``key`` may be repaired again (``now`` or earlier: at once)."""
        times = [t for t in self._times.get(key, ()) if now - t < self.window_s]
        if times:
            self._times[key] = times
        else:
            self._times.pop(key, None)
        excess = len(times) - self.burst + 1
        if excess <= 0:
            return now
        return times[-1] + self._wait.after(excess - 1)

    def record(self, key: Hashable, now: float) -> None:
        """A repair of ``key`` was made at ``now``."""
        self._times.setdefault(key, []).append(now)
        if len(self._times) > 10_000:  # bounded: forget children past the window
            self._times = {k: v for k, v in self._times.items()
                           if v and now - v[-1] < self.window_s}
