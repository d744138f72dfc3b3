"""The admin server's accept loop: each new connection held, refused, or answered at once.

:class:`AcceptLoop` owns the accepting; :mod:`supervisor.admin.connections` decides the fit.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from contextlib import suppress

import trio

from supervisor.admin.connections import ConnectionTable, Peer, peek, reset
from supervisor.logs import get_logger
from supervisor.streak import Streak

__all__ = ["AcceptLoop"]

log = get_logger("admin")

CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# The peer gave up between its SYN and our accept, or a firewall rule refused it:
# nothing to do but accept the next one (the errnos trio's SocketListener ignores).
IGNORABLE_ACCEPT_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPERM, errno.EPROTO})
ACCEPT_RETRY_S = 0.1
ACCEPT_BATCH = 256
# How much of a waiting request head the accept loop looks at for ``answer``.
ANSWER_PEEK = 2048
# A streak of failed accepts or refusals ends at a success this long after its last one.
STREAK_QUIET_S = 1.0


def _spare() -> int | None:
    """One descriptor kept open so that, out of descriptors, accept can still refuse."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # still out of descriptors


class AcceptLoop:
    """Accepts on the listening socket ``sock``: each connection that fits goes to ``table``.

    Then it is handed to ``spawn``, which must remove it from the table when it ends.
    Why not trio's ``SocketListener``: it accepts one connection per scheduler pass.
    Under a flood the backlog, and a ``/healthz`` probe in it, waits behind every task.
    This loop drains up to ``ACCEPT_BATCH`` waiting connections per wake-up.
    It decides each one's fate at once: held, evicting an idle one, or refused.
    ``table`` decides the pool.

    ``answer`` answers a request from its head alone: ``/healthz`` with ``Connection: close``,
    as probes send it. When that head is already waiting at accept, the loop answers it.
    It takes no slot and no scheduling round: a probe keeps its latency however busy.

    ``accept`` out of descriptors or memory (``EMFILE``, ``ENFILE``, ``ENOBUFS``,
    ``ENOMEM``) is logged once when a streak begins and once when it ends, with the count.
    So are refusals at the limit (:class:`~supervisor.streak.Streak`).
    A streak ends at the first success a second after its last failure.
    So failures interleaved with successes, a flood at the limit, are one streak.
    During a streak the spare descriptor (:class:`_Spare`) is let go to accept and reset.
    Its client is refused rather than left in the backlog.
    """

    def __init__(self, sock: socket.socket, table: ConnectionTable,
                 spawn: Callable[[Peer, trio.SocketStream, str], None],
                 answer: Callable[[bytes], bytes | None] | None = None) -> None:
        self._sock = sock
        self._table = table
        self._spawn = spawn
        self._answer = answer
        self._spare = _spare()
        self._accept_errors = Streak(log, began="admin accept failing",
                                     ended="admin accept recovered", quiet_s=STREAK_QUIET_S,
                                     ended_level="warning", count_as="count")
        self._full = Streak(log, began="admin connection limit reached; refusing new connections",
                            ended="admin connections accepted again", quiet_s=STREAK_QUIET_S,
                            ended_level="warning", count_as="count")

    def close(self) -> None:
        """Stop listening: a client connecting from now on is refused by the kernel."""
        if self._sock.fileno() != -1:
            trio.lowlevel.notify_closing(self._sock)
            self._sock.close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    async def run(self) -> None:
        """Until the socket is closed (returns) or cancelled."""
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
            self._accept_errors.recovered()
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
        self._full.recovered(limit=self._table.limit)
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
        waiting = peek(sock, ANSWER_PEEK)
        end = waiting.find(b"\r\n\r\n")
        reply = answer(waiting[: end + 4]) if end >= 0 else None
        if reply is None:
            return False
        with suppress(OSError):  # the client is gone: nothing to answer
            # Read the head first: closing with unread bytes would reset the
            # connection, and the client could lose the answer.
            sock.recv(end + 4, socket.MSG_DONTWAIT)
            sock.send(reply, socket.MSG_DONTWAIT)  # a few hundred bytes: fits at once
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
        if self._spare is not None:
            os.close(self._spare)
            with suppress(OSError):
                reset(self._sock.accept()[0])
            self._spare = _spare()
