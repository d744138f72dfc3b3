"""The admin server's table of held connections: two pools, and which connections are idle.

:class:`ConnectionTable` owns the pools; :mod:`supervisor.admin.accept` feeds it.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
from collections import OrderedDict
from collections.abc import Callable
from contextlib import suppress

import trio

from supervisor.telemetry import Metrics

__all__ = ["ConnectionTable", "Peer", "has_pending", "peek", "reset"]

Peer = tuple[str, int]

# How many idle connections an eviction looks at to find one with nothing to read.
EVICTION_SCAN = 16
# A reserve connection idle for less than this is not evicted (the newcomer is
# refused instead): its client may not have sent its request yet, and a burst
# accepted in one batch must not evict the probes among it.
MIN_IDLE_S = 0.02


def reset(connection: trio.SocketStream | socket.socket) -> None:
    """Abort a connection with a RST: buffered unsent data is dropped, and a task
    blocked on it wakes (trio's close notifies waiters)."""
    sock = connection.socket if isinstance(connection, trio.SocketStream) else connection
    with suppress(OSError):  # already closed or not a TCP socket: closing is all that is left
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def has_pending(sock: socket.socket | trio.socket.SocketType) -> bool:
    """Whether the peer's bytes wait unread in the socket's receive buffer."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return False
    return int(struct.unpack("i", raw)[0]) > 0


def peek(sock: socket.socket, size: int = 64) -> bytes:
    """What the peer has sent so far (up to ``size`` bytes), without consuming it."""
    try:
        return sock.recv(size, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return b""


class _Pool:
    def __init__(
        self, limit: int, keep: Callable[[socket.socket], bool], min_idle_s: float = 0.0
    ) -> None:
        self.limit = limit
        self.conns: dict[Peer, tuple[trio.SocketStream, socket.socket]] = {}
        # Idle connections and since when, longest idle first.
        self.idle: OrderedDict[Peer, float] = OrderedDict()
        self._keep = keep
        self._min_idle_s = min_idle_s

    def evict_idle(self) -> Peer | None:
        """Close the longest-idle connection; which one (None: none is idle).

        A connection the pool wants to ``keep`` is passed over: request bytes wait unread.
        Its task has not had its turn: it is about to be busy, and may be a probe.
        At most EVICTION_SCAN are looked at. One idle under ``min_idle_s`` is passed over too.
        Just accepted, its client has not had the time to send anything yet.
        """
        now = trio.current_time()
        for _ in range(min(EVICTION_SCAN, len(self.idle))):
            peer, since = next(iter(self.idle.items()))
            if now - since < self._min_idle_s:
                return None  # the rest are younger still
            del self.idle[peer]
            stream, raw = self.conns[peer]
            if self._keep(raw):
                self.idle[peer] = now  # to the back of the line
                continue
            del self.conns[peer]
            reset(stream)
            return peer
        return None


class ConnectionTable:
    """Held connections by peer, in two pools, and which of them are idle.

    The main pool holds ``limit`` connections (:mod:`supervisor.admin.limits`).
    One accepted at the limit makes room by closing the one idle longest.
    Idle: no request in progress, before the first complete head or between requests.
    So a flood that never sends a request only displaces itself.
    A ``/healthz`` probe, which sends its request at once, always finds a slot.
    With none idle (that many requests in flight: streams are capped below the limit),
    the new one goes to the reserve pool, same rule: ``reserved`` slots, ``/healthz``
    only (:attr:`RESERVE`). When that is full of busy ones too, it is reset at once.
    Evictions and refusals count in ``supervisor_admin_connections_shed_total``.
    An evicted connection is reset (:func:`reset`): its buffers drop, a blocked task wakes.
    """

    MAIN = "main"
    RESERVE = "reserve"

    def __init__(
        self,
        limit: int,
        reserved: int = 0,
        metrics: Metrics | None = None,
        *,
        reserve_admits: Callable[[bytes], bool] = lambda head: False,
    ) -> None:
        self.limit = limit
        self.reserve_admits = reserve_admits
        self._metrics = metrics
        self._pools = {
            self.MAIN: _Pool(limit, has_pending),
            self.RESERVE: _Pool(reserved, lambda raw: reserve_admits(peek(raw)), MIN_IDLE_S),
        }
        if metrics is not None:
            metrics.admin_connection_limit.set(limit)

    def __len__(self) -> int:
        return sum(len(pool.conns) for pool in self._pools.values())

    def get(self, peer: Peer) -> trio.SocketStream | None:
        return next((p.conns[peer][0] for p in self._pools.values() if peer in p.conns), None)

    def streams(self) -> list[trio.SocketStream]:
        return [held[0] for pool in self._pools.values() for held in pool.conns.values()]

    def add(
        self, peer: Peer, stream: trio.SocketStream, raw: socket.socket, pool_name: str = MAIN
    ) -> None:
        """Hold a new connection (``raw``: its stdlib socket, for peeking at it); it
        is idle until its first request head arrives."""
        pool = self._pools[pool_name]
        pool.conns[peer] = (stream, raw)
        pool.idle[peer] = trio.current_time()
        self._count()

    def set_idle(self, peer: Peer, stream: trio.SocketStream, idle: bool) -> None:
        pool = self._holding(peer, stream)
        if pool is None:
            return  # evicted meanwhile
        if idle:
            pool.idle[peer] = trio.current_time()
            pool.idle.move_to_end(peer)
        else:
            pool.idle.pop(peer, None)

    def remove(self, peer: Peer, stream: trio.SocketStream) -> None:
        pool = self._holding(peer, stream)
        if pool is not None:
            del pool.conns[peer]
            pool.idle.pop(peer, None)
            self._count()

    def _holding(self, peer: Peer, stream: trio.SocketStream) -> _Pool | None:
        """The pool holding ``stream`` as ``peer``'s connection; None once it is not (evicted)."""
        return next((p for p in self._pools.values()
                     if peer in p.conns and p.conns[peer][0] is stream), None)

    def make_room(self, pool_name: str = MAIN) -> bool:
        """True when one more connection fits in the pool (:attr:`MAIN` or
        :attr:`RESERVE`), closing the longest-idle connection of that pool if it is
        full; False when it is full of busy connections."""
        pool = self._pools[pool_name]
        if len(pool.conns) < pool.limit:
            return True
        evicted = pool.evict_idle()
        if evicted is None:
            return False
        self.shed("evicted")
        self._count()
        return True

    def shed(self, how: str) -> None:
        if self._metrics is not None:
            self._metrics.admin_connections_shed.labels(how).inc()

    def _count(self) -> None:
        if self._metrics is not None:
            self._metrics.admin_connections.set(len(self))
