"""The per-kind work queue of parent names: :class:`WorkQueue`, client-go's workqueue in small."""

from __future__ import annotations

from collections import deque

import trio

__all__ = ["WorkQueue"]


class WorkQueue:
    """Deduplicating keys, one worker per key at a time (client-go's workqueue, in small).

    A key added while queued is a no-op; added while being processed, it is
    processed once more after :meth:`done`. Its ``len`` (queued, not yet taken) is the
    ``fanout_queue_depth`` gauge.
    """

    def __init__(self) -> None:
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._dirty: set[str] = set()
        # key -> when it is added, and the scope its wait runs in
        self._delayed: dict[str, tuple[float, trio.CancelScope]] = {}
        self._lot = trio.lowlevel.ParkingLot()
        self._idle_lot = trio.lowlevel.ParkingLot()
        self._nursery: trio.Nursery | None = None

    def bind(self, nursery: trio.Nursery) -> None:
        """Run :meth:`requeue`'s delays in ``nursery`` (the engine's, while it runs)."""
        self._nursery = nursery

    def requeue(self, key: str, delay_s: float) -> None:
        """:meth:`add_after` without waiting for it: run in the bound nursery."""
        assert self._nursery is not None, "requeue before bind"
        self._nursery.start_soon(self.add_after, key, delay_s)

    def add(self, key: str) -> None:
        if key in self._queued:
            return
        if key in self._active:
            self._dirty.add(key)
            return
        self._queued.add(key)
        self._queue.append(key)
        self._lot.unpark()

    async def add_after(self, key: str, delay_s: float) -> None:
        """Add ``key`` after ``delay_s`` (run it in a nursery); the sooner pending delay wins.

        One pending delay per key, as client-go's delaying queue: a long retry wait must
        not hold back a deferred repair due sooner. A delay ending later than the one
        pending is dropped; a pending one ending later is superseded: its wait ends at
        once, adding nothing. A cancelled delay adds nothing either (and may leave the
        queue idle).
        """
        due = trio.current_time() + delay_s
        pending = self._delayed.get(key)
        if pending is not None and pending[0] <= due:
            return
        if pending is not None:
            # Its wait ends now: one sleeping task per key, not one per
            # superseded delay (an hour's Retry-After superseded by every event).
            pending[1].cancel()
        scope = trio.CancelScope(deadline=due)
        self._delayed[key] = (due, scope)
        try:
            with scope:
                await trio.sleep_forever()
        finally:
            entry = self._delayed.get(key)
            mine = entry is not None and entry[1] is scope
            if mine:
                del self._delayed[key]
                if not scope.cancelled_caught and self.idle():
                    self._idle_lot.unpark_all()  # cancelled: nothing was added
        if mine and scope.cancelled_caught:
            self.add(key)

    async def get(self) -> str:
        while not self._queue:
            await self._lot.park()
        key = self._queue.popleft()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: str) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)
        if self.idle():
            self._idle_lot.unpark_all()

    async def wait_idle(self) -> None:
        """Return once nothing is queued, processing, or waiting to be requeued."""
        while not self.idle():
            await self._idle_lot.park()

    def pending(self, key: str) -> bool:
        """Will ``key`` be taken (again): queued, added while processed, or delayed?"""
        return key in self._queued or key in self._dirty or key in self._delayed

    def idle(self) -> bool:
        """Nothing queued, processing, or waiting to be requeued."""
        return not (self._queue or self._active or self._delayed)

    def __len__(self) -> int:
        """Keys queued and not yet taken by a worker."""
        return len(self._queue)
