"""The in-process event bus: what was published, rejected, or changed state.

``docs/admin-api.md`` is generated from the event Structs declared here.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import TypeVar

import msgspec
import trio

from supervisor.status_doc import ChildReport, LeadershipReport, RevisionReport

__all__ = ["EVENT_TYPES", "Event", "EventBus", "Published", "Rejected", "StatusChanged",
           "Subscription", "utc_now_iso"]


class Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """What every event carries (stamped by :meth:`EventBus.emit`, whatever is set here)."""

    seq: int = 0  # a monotonically increasing number
    at: str = ""  # UTC, ISO 8601


class Published(Event, tag="published", kw_only=True):
    """A snapshot was swapped in: now serving ``revision`` (from ``source``, named as
    ``revision.source`` of ``/status`` names it: a follower's upstream by its address)."""

    revision: int
    generation: int
    source: str
    took_s: float


class Rejected(Event, tag="rejected", kw_only=True):
    """A candidate revision was refused; ``active`` keeps serving."""

    revision: int
    reason: str
    detail: str
    active: int | None


class StatusChanged(Event, tag="status", kw_only=True):
    """Part of the ``/status`` document changed; only the parts that did are present."""

    control_plane_up: bool | msgspec.UnsetType = msgspec.UNSET
    revision: RevisionReport | msgspec.UnsetType = msgspec.UNSET
    children: dict[str, ChildReport] | msgspec.UnsetType = msgspec.UNSET
    leadership: LeadershipReport | msgspec.UnsetType = msgspec.UNSET


_E = TypeVar("_E", bound=Event)

#: Every event type the daemon emits, by its ``type``.
EVENT_TYPES: dict[str, type[Event]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in (Published, Rejected, StatusChanged)
}


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class Subscription:
    """One consumer's bounded view of the bus. Use as a context manager."""

    def __init__(self, bus: EventBus, max_buffer: int) -> None:
        self._bus = bus
        self._send, self.receive = trio.open_memory_channel[Event](max_buffer)
        self.overflowed = False

    def _offer(self, event: Event) -> None:
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
    """Carries events from producers to subscribers; producers are never slowed.

    Producers (the convergence loop, the supervision tree, the fan-out's elector) call
    :meth:`emit` with one of :class:`Published`, :class:`Rejected`, :class:`StatusChanged`.
    Each subscriber has a bounded buffer. One whose buffer is full is *dropped*: its
    channel is closed and :attr:`Subscription.overflowed` set. The admin API's WebSocket
    stream is the consumer; it closes a dropped client with a reason.
    """
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

    def emit(self, event: _E) -> _E:
        """Deliver ``event``, stamped, to every subscriber now; never blocks, never fails.

        The copy gets ``seq`` (monotonically increasing) and ``at`` (UTC, ISO 8601). Its
        JSON is ``type`` first, then ``seq``, ``at`` and the event's own keys. A ``status``
        event carries only the parts of ``/status`` that changed (:mod:`supervisor.status_doc`).

        Returns the stamped copy every subscriber received (``event`` is left as it was).
        """
        delivered = msgspec.structs.replace(event, seq=next(self._seq), at=utc_now_iso())
        for sub in list(self._subscribers):
            sub._offer(delivered)
        return delivered
