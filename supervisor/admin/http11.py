"""One admin connection: hypercorn's HTTP/1.1 protocol, never its HTTP/2.

hypercorn switches a connection to HTTP/2 when a request line is the HTTP/2
preface (``PRI * HTTP/2.0``) or carries ``Upgrade: h2c``; its HTTP/2 side then
restarts the idle timer only when a stream closes, so a client that sends the
preface and nothing else is never timed out. The admin
API serves HTTP/1.1 only:

- a request that is not HTTP/1.0 or 1.1 (the preface is ``PRI * HTTP/2.0``)
  closes the connection at once, without an answer;
- ``Upgrade: h2c`` is ignored and the request served over HTTP/1.1 (RFC 9110
  section 7.8 lets a server ignore an upgrade it does not want).

Before hypercorn sees a connection at all, :func:`first_request_head` waits
(cheaply: one task, no protocol state) until its first request head is complete,
refusing the HTTP/2 preface at once and a connection that has not sent a
complete head within the idle deadline. After that hypercorn's idle timer runs
between keep-alive requests (``keep_alive_timeout``), and a ``PRI`` request
arriving on a keep-alive connection also closes it.

:class:`Http11Connection` also reports each change between idle (no request in
progress) and busy to ``on_idle``; the connection table uses that to choose
which connection to give up when it is full.

The hypercorn names used here (``TCPServer``, ``H11Protocol`` and its
``_check_protocol`` hook, the ``Closed``/``Updated`` events) are pinned by the
``hypercorn<0.19`` requirement and exercised by the integration tests.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import h11
import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.typing import ConnectionState
from hypercorn.utils import parse_socket_addr
from wsproto.connection import ConnectionState as WsState

from supervisor.admin.connections import reset
from supervisor.admin.frames import ConnectionGone

__all__ = ["Http11Connection", "first_request_head"]

_HTTP1 = frozenset({b"1.0", b"1.1"})
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# A head longer than this is handed to hypercorn as it is (h11 answers 431).
MAX_HEAD_BYTES = 16 * 1024
# hypercorn's writes go out in pieces of this size, each within WRITE_STALL_S, the
# server's idle deadline (a client must take at least WRITE_PIECE / WRITE_STALL_S,
# about 13 KB/s, or be reset).
WRITE_PIECE = 64 * 1024
WRITE_STALL_S = 5.0


async def first_request_head(
    stream: trio.SocketStream, deadline_s: float, *, only: tuple[bytes, ...] | None = None
) -> bool:
    """Wait, without consuming anything, until ``stream`` holds a complete request
    head; False when it does not within ``deadline_s``, when the peer closed, when
    it starts with the HTTP/2 preface (``PRI ``: refused at once), or when ``only``
    is given and the head starts with none of its prefixes.

    Looks with ``MSG_PEEK``, so hypercorn then reads the same bytes itself. Between
    looks, ``SO_RCVLOWAT`` makes the socket readable only once *more* bytes have
    arrived, so a client trickling its head costs one wake-up per segment, not a
    polling loop.
    """
    sock = stream.socket
    want = 1
    try:
        with trio.move_on_after(deadline_s):
            while True:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                await trio.lowlevel.wait_readable(sock)
                data = await sock.recv(MAX_HEAD_BYTES, socket.MSG_PEEK)
                if not data:
                    return False
                if data[:4] == H2_PREFACE[:4]:
                    return False
                # Readable without more bytes than last time: the peer shut its
                # side down mid-head; hypercorn answers what there is (400).
                ended = len(data) < want
                if b"\r\n\r\n" in data or len(data) >= MAX_HEAD_BYTES or ended:
                    return only is None or data.startswith(only)
                want = len(data) + 1
        return False
    except (OSError, trio.ClosedResourceError):
        return False  # reset by the peer, or closed under us (evicted)
    finally:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        except OSError:
            pass  # closed: nothing will read it any more


class _NotHttp11(Exception):
    """The peer spoke something other than HTTP/1.x (the HTTP/2 preface)."""


class _Http11Protocol(H11Protocol):
    async def handle(self, event: Event) -> None:
        try:
            await super().handle(event)
        except _NotHttp11:
            await self.send(Closed())

    async def _check_protocol(self, event: h11.Request) -> None:
        if event.http_version not in _HTTP1 or event.method == b"PRI":
            raise _NotHttp11
        # Upgrade: h2c falls through: the request is served as HTTP/1.1.


class Http11Connection(TCPServer):
    """hypercorn's ``TCPServer`` for a plain (not TLS) socket stream, HTTP/1.1 only."""

    def __init__(
        self,
        app: Any,
        config: Any,
        context: Any,
        stream: Any,
        on_idle: Callable[[bool], None],
    ) -> None:
        super().__init__(app, config, context, ConnectionState({}), stream)
        self._on_idle = on_idle
        self._socket_stream: trio.SocketStream = stream

    async def run(self) -> None:
        # TCPServer.run without its TLS branch, building our protocol instead of
        # hypercorn's ProtocolWrapper (which would switch to HTTP/2).
        sock = self.stream.socket
        try:
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
            async with TaskGroup() as task_group:
                self._task_group = task_group
                # Same interface (initiate, handle) as the wrapper it replaces.
                self.protocol = _Http11Protocol(  # type: ignore[assignment]
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                )
                await self.protocol.initiate()
                await self.idle_task.restart(self._task_group, self._idle_timeout)
                await self._read_data()
        except OSError:
            pass
        finally:
            await self._close()

    async def send_raw(self, data: bytes) -> None:
        """Write ``data``, already a complete WebSocket frame (the stream hub's one
        frame per event, shared by every client), under the lock hypercorn's own
        writes take, so frames never interleave; ConnectionGone when the
        connection is closed or reset, or the WebSocket no longer open.

        The state is checked inside the lock: once hypercorn has sent (or is
        sending) its close frame, no data frame may follow it (RFC 6455, 5.5.1).
        The write is shielded like hypercorn's own: a frame is never cut in half
        by a client's disconnect (a half-closed client still reads); one that
        stays blocked is reset by the hub's monitor (or at shutdown), which ends
        it with ConnectionGone."""
        async with self.send_lock:
            if not self._websocket_open():
                raise ConnectionGone("the WebSocket is closing or closed")
            try:
                with trio.CancelScope(shield=True):
                    await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError,
                    trio.BusyResourceError) as exc:
                # Busy: hypercorn's own end of the connection (send_eof) raced us.
                raise ConnectionGone(str(exc)) from exc

    def _websocket_open(self) -> bool:
        stream = getattr(self.protocol, "stream", None)
        connection = getattr(stream, "connection", None)
        if connection is None or getattr(stream, "closed", True):
            return False
        return bool(connection.state is WsState.OPEN)

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            self._on_idle(event.idle)
        if isinstance(event, RawData):
            await self._send_bounded(event.data)
            return
        await super().protocol_send(event)

    async def _send_bounded(self, data: bytes) -> None:
        """hypercorn's own write (shielded, under its lock), in pieces of WRITE_PIECE
        bytes each of which must be taken within WRITE_STALL_S, else the connection
        is reset: a client that reads slowly or not at all (thousands of pipelined
        ``/healthz`` answers left unread) cannot keep it busy past the deadline,
        while one that reads, however slowly its link, keeps it."""
        async with self.send_lock:
            stalled = False
            try:
                with trio.CancelScope(shield=True):
                    view = memoryview(data)
                    for start in range(0, len(view), WRITE_PIECE):
                        with trio.move_on_after(WRITE_STALL_S) as piece:
                            await self.stream.send_all(view[start : start + WRITE_PIECE])
                        if piece.cancelled_caught:
                            stalled = True
                            break
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            else:
                if not stalled:
                    return
                reset(self._socket_stream)
        await self.protocol.handle(Closed())
