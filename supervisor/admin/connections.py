"""The admin server's accept loop and its table of held connections.

Contract:

- At most ``limit`` connections are held in the main pool (:mod:`supervisor.admin.limits`
  derives it from ``RLIMIT_NOFILE``). A connection accepted at the limit makes
  room by closing the connection that has been *idle* longest: idle means no
  request in progress, i.e. still waiting for its first complete request head
  or between keep-alive requests. A flood of connections that never send a
  request therefore only ever displaces itself, and a ``/healthz`` probe (which
  sends its request at once) always finds a slot. When no connection is idle
  (every slot is busy: stream clients are capped below the limit, so this means
  that many requests in flight), the new connection goes to a small reserve
  pool that serves ``/healthz`` only (with the same longest-idle rule); when
  that is full of busy connections too, it is refused at once with a reset.
  Evictions and refusals are counted in ``supervisor_admin_connections_shed_total``.
- A request that can be answered from its head alone, at once (``answer``: the
  server's ``/healthz`` with ``Connection: close``, the way probes send it), is
  answered by the accept loop itself when its complete head is already waiting
  at accept: it takes no slot and waits for no scheduling round beyond the
  loop's own, so a probe keeps its latency however busy the handlers are.
- ``accept`` failing for lack of descriptors or memory (``EMFILE``, ``ENFILE``,
  ``ENOBUFS``, ``ENOMEM``) is logged once when a streak of failures begins and
  once when it ends, with the count, never once per retry; so are refusals at
  the limit. During a streak a
  spare descriptor, kept open for this, is let go to accept and reset the
  waiting connection, so its client is refused rather than left in the backlog.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import termios
from collections import OrderedDict
from collections.abc import Callable

import trio

from supervisor.logs import get_logger
from supervisor.telemetry import Metrics

__all__ = ["AcceptLoop", "ConnectionTable", "Peer", "reset"]

log = get_logger("admin")

Peer = tuple[str, int]

CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# The peer gave up between its SYN and our accept, or a firewall rule refused it:
# nothing to do but accept the next one (the errnos trio's SocketListener ignores).
IGNORABLE_ACCEPT_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPERM, errno.EPROTO})
ACCEPT_RETRY_S = 0.1
ACCEPT_BATCH = 256
# How many idle connections an eviction looks at to find one with nothing to read.
EVICTION_SCAN = 16
# How much of a waiting request head the accept loop looks at for ``answer``.
ANSWER_PEEK = 2048
# A reserve connection idle for less than this is not evicted (the newcomer is
# refused instead): its client may not have sent its request yet, and a burst
# accepted in one batch must not evict the probes among it.
MIN_IDLE_S = 0.02


def reset(stream: trio.SocketStream) -> None:
    """Abort a connection with a RST: buffered unsent data is dropped, and a task
    blocked on it wakes (trio's close notifies waiters)."""
    sock = stream.socket
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass  # already closed or not a TCP socket: closing is all that is left
    sock.close()


def _has_pending(sock: socket.socket) -> bool:
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return False
    return int(struct.unpack("i", raw)[0]) > 0


def peek(sock: socket.socket) -> bytes:
    """What the peer has sent so far (up to 64 bytes), without consuming it."""
    try:
        return sock.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
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

        A connection the pool wants to ``keep`` (request bytes already waiting
        that its task has not had its turn to read: it is about to be busy, and
        it may be a probe) is passed over; at most EVICTION_SCAN are looked at.
        So is one idle for less than ``min_idle_s``: just accepted, its client
        has not had the time to send anything yet.
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

    The main pool holds ``limit`` connections. The reserve pool
    (``reserved`` slots, taken only when the main pool is full of busy
    connections) serves ``/healthz`` and nothing else (:attr:`RESERVE`), so a
    probe is answered even then.
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
            self.MAIN: _Pool(limit, _has_pending),
            self.RESERVE: _Pool(reserved, lambda raw: reserve_admits(peek(raw)), MIN_IDLE_S),
        }
        self._pool_of: dict[Peer, _Pool] = {}
        if metrics is not None:
            metrics.admin_connection_limit.set(limit)

    def __len__(self) -> int:
        return len(self._pool_of)

    def get(self, peer: Peer) -> trio.SocketStream | None:
        pool = self._pool_of.get(peer)
        held = None if pool is None else pool.conns.get(peer)
        return None if held is None else held[0]

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
        self._pool_of[peer] = pool
        self._count()

    def set_idle(self, peer: Peer, stream: trio.SocketStream, idle: bool) -> None:
        pool = self._pool_of.get(peer)
        if pool is None or self.get(peer) is not stream:
            return  # evicted meanwhile
        if idle:
            pool.idle[peer] = trio.current_time()
            pool.idle.move_to_end(peer)
        else:
            pool.idle.pop(peer, None)

    def remove(self, peer: Peer, stream: trio.SocketStream) -> None:
        pool = self._pool_of.get(peer)
        if pool is not None and self.get(peer) is stream:
            del pool.conns[peer]
            pool.idle.pop(peer, None)
            del self._pool_of[peer]
            self._count()

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
        del self._pool_of[evicted]
        self.shed("evicted")
        self._count()
        return True

    def shed(self, how: str) -> None:
        if self._metrics is not None:
            self._metrics.admin_connections_shed.labels(how).inc()

    def _count(self) -> None:
        if self._metrics is not None:
            self._metrics.admin_connections.set(len(self._pool_of))


class _Streak:
    """Logs the first failure of a streak and, once it has ended, how many there
    were. A streak ends at the first success at least ``quiet_s`` after the last
    failure: failures interleaved with successes (a flood at the limit, where
    some connections still get in) are one streak, not one line each."""

    def __init__(self, begins: str, ends: str, quiet_s: float = 1.0) -> None:
        self._begins, self._ends, self._quiet_s = begins, ends, quiet_s
        self.count = 0
        self._last = 0.0

    def failed(self, **fields: object) -> None:
        self.count += 1
        self._last = trio.current_time()
        if self.count == 1:
            log.warning(self._begins, **fields)

    def ended(self, **fields: object) -> None:
        if self.count and trio.current_time() - self._last >= self._quiet_s:
            log.warning(self._ends, count=self.count, **fields)
            self.count = 0


class _Spare:
    """One descriptor kept open so that, out of descriptors, accept can still refuse."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.take()

    def take(self) -> None:
        if self._fd is None:
            try:
                self._fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._fd = None  # still out of descriptors; retried after the next refusal

    def give(self) -> bool:
        if self._fd is None:
            return False
        os.close(self._fd)
        self._fd = None
        return True


class AcceptLoop:
    """Accepts on the listening socket ``sock``; each connection that fits is added
    to ``table`` and handed to ``spawn``, which must remove it from the table when
    it ends.

    Why not trio's ``SocketListener``: it accepts one connection per pass of the
    scheduler, so under a flood the backlog (and a ``/healthz`` probe in it) waits
    behind every other task's turn many times over. This loop drains up to
    ``ACCEPT_BATCH`` waiting connections per wake-up, deciding each one's fate
    (held, evicting an idle one, or refused) at once.
    """

    def __init__(
        self,
        sock: socket.socket,
        table: ConnectionTable,
        spawn: Callable[[Peer, trio.SocketStream, str], None],
        answer: Callable[[bytes], bytes | None] | None = None,
    ) -> None:
        self._sock = sock
        self._table = table
        self._spawn = spawn
        self._answer = answer
        self._spare = _Spare()
        self._accept_errors = _Streak("admin accept failing", "admin accept recovered")
        self._full = _Streak(
            "admin connection limit reached; refusing new connections",
            "admin connections accepted again",
        )

    def close(self) -> None:
        """Stop listening: a client connecting from now on is refused by the kernel."""
        if self._sock.fileno() != -1:
            trio.lowlevel.notify_closing(self._sock)
            self._sock.close()
        self._spare.give()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Until the socket is closed (returns) or cancelled."""
        task_status.started()
        while True:
            try:
                await trio.lowlevel.wait_readable(self._sock)
            except (trio.ClosedResourceError, OSError):
                return
            backoff = self._accept_batch()
            if backoff:
                await trio.sleep(ACCEPT_RETRY_S)
            else:
                await trio.lowlevel.checkpoint()

    def _accept_batch(self) -> bool:
        """Accept what is waiting (up to ACCEPT_BATCH); True when out of descriptors."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._sock.accept()
            except BlockingIOError:
                return False
            except OSError as exc:
                if exc.errno in CAPACITY_ERRNOS:
                    self._out_of_descriptors(exc)
                    return True
                if exc.errno in IGNORABLE_ACCEPT_ERRNOS:
                    continue
                raise
            self._accept_errors.ended()
            self._admit(sock)
        return False

    def _admit(self, sock: socket.socket) -> None:
        if self._answer is not None and self._answered(sock, self._answer):
            return
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        pool = self._pool_for(sock)
        if pool is None:
            self._table.shed("refused")
            self._full.failed(limit=self._table.limit)
            reset(stream)
            return
        self._full.ended(limit=self._table.limit)
        try:
            address = sock.getpeername()
        except OSError:
            sock.close()  # gone before we looked
            return
        # Held from this moment, not from when its task starts: a burst of
        # accepts must not overshoot the limit.
        peer = (str(address[0]), int(address[1]))
        self._table.add(peer, stream, sock, pool)
        self._spawn(peer, stream, pool)

    def _answered(self, sock: socket.socket, answer: Callable[[bytes], bytes | None]) -> bool:
        """Answer and close ``sock`` now if its waiting head is one ``answer`` knows."""
        try:
            waiting = sock.recv(ANSWER_PEEK, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:
            return False
        end = waiting.find(b"\r\n\r\n")
        reply = answer(waiting[: end + 4]) if end >= 0 else None
        if reply is None:
            return False
        try:
            # Read the head first: closing with unread bytes would reset the
            # connection, and the client could lose the answer.
            sock.recv(end + 4, socket.MSG_DONTWAIT)
            sock.send(reply, socket.MSG_DONTWAIT)  # a few hundred bytes: fits at once
        except OSError:
            pass  # the client is gone: nothing to answer
        sock.close()
        return True

    def _pool_for(self, sock: socket.socket) -> str | None:
        table = self._table
        if table.make_room(table.MAIN):
            return table.MAIN
        # Full of busy connections: only /healthz may use the reserve. A request
        # already here that is anything else is refused now; one not here yet
        # gets a reserve slot until its head shows what it is.
        head = peek(sock)
        if head and not table.reserve_admits(head):
            return None
        return table.RESERVE if table.make_room(table.RESERVE) else None

    def _out_of_descriptors(self, exc: OSError) -> None:
        self._accept_errors.failed(error=errno.errorcode.get(exc.errno or 0, "?"))
        # With the spare descriptor let go, the connection waiting in the backlog
        # can be accepted, only to be reset: refused, not left waiting.
        if self._spare.give():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                pass
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            self._spare.take()
