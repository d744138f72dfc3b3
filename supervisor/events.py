"""The in-process event bus: what was published, rejected, or changed state.

Producers (the convergence loop, the supervision tree) call :meth:`EventBus.publish`,
which never blocks and never fails: each subscriber has its own bounded buffer,
and a subscriber whose buffer is full is *dropped* (its receive channel is
closed and :attr:`Subscription.overflowed` is set) rather than slowing the
producer or the other subscribers. The admin API's WebSocket stream is the
consumer; it closes a dropped client with a reason.

Events are plain JSON-ready dicts with a ``type`` key (``published``,
``rejected``, ``status``) and a monotonically increasing ``seq``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import trio

__all__ = ["EventBus", "Subscription", "utc_now_iso"]


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class Subscription:
    """One consumer's bounded view of the bus. Use as a context manager."""

    def __init__(self, bus: EventBus, max_buffer: int) -> None:
        self._bus = bus
        self._send, self.receive = trio.open_memory_channel[dict[str, Any]](max_buffer)
        self.overflowed = False

    def _offer(self, event: dict[str, Any]) -> None:
        if self.overflowed:
            return
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            self.overflowed = True
            self._send.close()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._bus._subscribers.discard(self)

    def close(self) -> None:
        self._bus._subscribers.discard(self)
        self._send.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()
        self._seq = itertools.count(1)

    def subscribe(self, max_buffer: int = 256) -> Subscription:
        sub = Subscription(self, max_buffer)
        self._subscribers.add(sub)
        return sub

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def publish(self, type_: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Deliver one event to every subscriber now; never blocks. Returns the event."""
        event = {"type": type_, "seq": next(self._seq), "at": utc_now_iso(), **payload}
        for sub in list(self._subscribers):
            sub._offer(event)
        return event
