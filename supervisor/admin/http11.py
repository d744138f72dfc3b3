"""One admin connection: HTTP/1.1 over h11, the stream's WebSocket over wsproto.

Our protocol, on the public APIs of ``h11`` and ``wsproto`` (neither does I/O; trio does).
:func:`first_request_head` waits for a plain connection's first head before any protocol state;
:class:`Http11Connection` serves it from then on.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any, NoReturn, TypeVar
from urllib.parse import unquote

import h11
import trio
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionState as WsState
from wsproto.connection import ConnectionType
from wsproto.events import (
    CloseConnection,
    Message,
    Ping,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, generate_accept_token

from supervisor.admin.connections import reset
from supervisor.admin.responses import error_response, http_date, raw_response
from supervisor.admin.stream import ConnectionGone, Receive, Scope, Send
from supervisor.logs import get_logger

__all__ = ["App", "Http11Connection", "first_request_head"]

log = get_logger("admin")

App = Callable[[Scope, Receive, Send], Awaitable[None]]
_T = TypeVar("_T")

_HTTP1 = frozenset({b"1.0", b"1.1"})
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_HEAD_BYTES = 16 * 1024
# No route takes a body (POST /v1/converge reads none): a small bound.
MAX_BODY_BYTES = 64 * 1024
# Clients have nothing to say on the stream: a small limit bounds what one can
# make us buffer.
MAX_MESSAGE_BYTES = 64 * 1024
RECEIVE_BYTES = 64 * 1024
WRITE_PIECE = 64 * 1024
WRITE_STALL_S = 5.0
# After our close frame, how long the client has to answer with its own before
# the TCP connection is closed anyway.
CLOSE_HANDSHAKE_S = 1.0
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_TOO_BIG = 1009
WEBSOCKET_VERSION = b"13"
_REFUSALS = {413: "body_too_large", 431: "head_too_large"}


async def first_request_head(stream: trio.SocketStream, *,
                             only: tuple[bytes, ...] | None = None) -> bool:
    """Wait, without consuming anything, until ``stream`` holds a complete request head.

    False when the peer closed; the caller's cancel scope bounds the wait.
    False too for the HTTP/2 preface (``PRI ``: refused at once), and when ``only``
    is given and the head starts with none of its prefixes.

    Looks with ``MSG_PEEK``, so the connection then reads the same bytes itself.
    Between looks, ``SO_RCVLOWAT`` wakes the socket only once *more* bytes arrived.
    So a client trickling its head costs one wake-up per segment, not a polling loop.
    """
    sock = stream.socket
    want = 1
    try:
        while True:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            await trio.lowlevel.wait_readable(sock)
            data = await sock.recv(MAX_HEAD_BYTES, socket.MSG_PEEK)
            if not data or data[:4] == H2_PREFACE[:4]:
                return False
            # Readable without more bytes than last time: the peer shut its
            # side down mid-head; the parser answers what there is (400).
            ended = len(data) < want
            if b"\r\n\r\n" in data or len(data) >= MAX_HEAD_BYTES or ended:
                return only is None or data.startswith(only)
            want = len(data) + 1
    except (OSError, trio.ClosedResourceError):
        return False  # reset by the peer, or closed under us (evicted)
    finally:
        with suppress(OSError):  # closed: nothing will read it any more
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


class _Gone(Exception):
    """The connection is closed, reset, or must end now (nothing more to send)."""


_TRANSPORT_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError,
                     trio.BusyResourceError, OSError)


def _tokens(headers: list[tuple[bytes, bytes]], name: bytes) -> set[bytes]:
    return {t.strip().lower() for n, v in headers if n == name for t in v.split(b",")}


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    values = [v for n, v in headers if n == name]
    return values[0].strip() if len(values) == 1 else None


def _valid_key(key: bytes | None) -> bool:
    try:
        return key is not None and len(base64.b64decode(key, validate=True)) == 16
    except ValueError:
        return False


class Http11Connection:
    """One accepted connection, until it ends; the app sees plain ASGI scopes.

    ``socket_stream`` is the TCP connection, which a stall resets; what is read and
    written is the stream :meth:`run`'s ``opening`` gives (the socket, or TLS over it).
    Each change between idle (no request in progress) and busy goes to ``on_idle``.
    The connection table uses that to choose whom to drop when full.
    What each connection is held to (why: :class:`~supervisor.admin.server._Server`):

    - HTTP/1.1 and 1.0 only: another version (HTTP/2's ``PRI * HTTP/2.0``) closes it unanswered.
      ``Upgrade: h2c`` is ignored and the request served (RFC 9110 section 7.8 allows it).
    - A complete head within ``idle_s`` of the accept or of the last answer, whatever trickles.
      A per-read timer would let one byte every few seconds hold it forever.
      The body is due within as long again.
    - A head over ``MAX_HEAD_BYTES`` answers 431, a body over ``MAX_BODY_BYTES`` 413.
      A malformed request answers 400 (framed by both ``Content-Length`` and
      ``Transfer-Encoding`` among them). Each ends its connection.
    - Writes go in ``WRITE_PIECE`` pieces, each taken within ``WRITE_STALL_S`` or reset.
    - The WebSocket handshake takes no extension: ``permessage-deflate`` is refused (RFC 6455).
      So no frame is inflated, and one with a reserved bit set closes it (1002).
    - A client message over ``MAX_MESSAGE_BYTES`` closes it with 1009.
      It is counted as its frames arrive, never buffered whole.
    """

    def __init__(self, app: App, socket_stream: trio.SocketStream, *,
                 client: tuple[str, int],
                 on_idle: Callable[[bool], None], idle_s: float,
                 only_paths: frozenset[bytes] | None = None) -> None:
        self._app = app
        self._stream: trio.abc.Stream = socket_stream
        self._socket_stream = socket_stream
        self._client = client
        self._on_idle = on_idle
        self._idle_s = idle_s
        self._only = only_paths
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._send_lock = trio.Lock()
        self._ws: WsConnection | None = None
        self._idle_scope: trio.CancelScope | None = None
        self._closing = False
        self._gone = False

    # -- what the server asks of a connection ---------------------------------

    def close_if_idle(self) -> None:
        """Shutdown: end now if opening or waiting for a request; otherwise after the answer."""
        self._closing = True
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    async def send_raw(self, data: bytes) -> None:
        """Write ``data``, already a complete WebSocket frame: the hub's one frame per event.

        It goes under the lock every write of this connection takes: frames never interleave.
        ConnectionGone when the connection is closed or reset, or the WebSocket not open.
        The state is checked inside the lock. After a close frame sent or received,
        no data frame may follow (RFC 6455, 5.5.1).
        The write is shielded: a client's disconnect never cuts a frame in half.
        (A half-closed client still reads.) One that stays blocked is reset by the hub's
        monitor, or at shutdown, which ends it with ConnectionGone.
        """
        async with self._send_lock:
            ws = self._ws
            if ws is None or ws.state is not WsState.OPEN or self._gone:
                raise ConnectionGone("the WebSocket is closing or closed")
            try:
                with trio.CancelScope(shield=True):
                    await self._stream.send_all(data)
            except _TRANSPORT_ERRORS as exc:
                self._gone = True
                raise ConnectionGone(str(exc)) from exc

    async def run(self, deadline: float,
                  opening: Callable[[], Awaitable[trio.abc.Stream | None]]) -> None:
        """Open, then serve requests until the connection ends (closed by either side, or a
        deadline missed); returns having closed nothing (the caller closes).

        ``opening`` waits for the first request head, or does the TLS handshake: the
        stream to serve, or None. By ``deadline`` and before shutdown, else it is reset.
        """
        stream = await self._by(deadline, opening)
        if stream is None:
            reset(self._socket_stream)
            return
        self._stream = stream
        with suppress(_Gone, *_TRANSPORT_ERRORS):  # ended on purpose, or the peer went away
            await self._serve(deadline)

    async def _by(self, deadline: float, step: Callable[[], Awaitable[_T]]) -> _T | None:
        """``step()``'s answer by ``deadline``; None when missed, or cut short by shutdown."""
        with trio.CancelScope(deadline=deadline) as scope:
            self._idle_scope = scope
            if self._closing:
                scope.cancel()
            try:
                return await step()
            finally:
                self._idle_scope = None
        return None

    # -- HTTP ------------------------------------------------------------------

    async def _serve(self, deadline: float) -> None:
        while True:
            request = await self._next_request(deadline)
            if request is None:
                return
            self._on_idle(False)
            if request.http_version not in _HTTP1 or request.method == b"PRI":
                return  # the HTTP/2 preface, or HTTP/2 spoken: not answered
            path = request.target.split(b"?", 1)[0]
            if self._only is not None and path not in self._only:
                return  # the reserve pool serves /healthz alone
            headers = [(n, v) for n, v in request.headers]
            if {b"content-length", b"transfer-encoding"} <= {n for n, _ in headers}:
                # The framing a proxy in front might read differently (request
                # smuggling): RFC 9112 section 6.3 lets a server refuse it.
                await self._refuse(400, "both Content-Length and Transfer-Encoding")
            if (b"websocket" in _tokens(headers, b"upgrade")
                    and b"upgrade" in _tokens(headers, b"connection")):
                await self._websocket(request, headers)
                return
            body = await self._body(self._idle_s)
            if body is None:
                return
            await self._http(request, headers, body)
            both = (self._h11.our_state, self._h11.their_state)
            if self._closing or both != (h11.DONE, h11.DONE):
                return
            self._h11.start_next_cycle()
            self._on_idle(True)
            deadline = trio.current_time() + self._idle_s

    async def _next_request(self, deadline: float) -> h11.Request | None:
        """The next request head by ``deadline``; None: close (deadline, EOF, shutdown)."""
        event = await self._by(deadline, self._next_event)
        if isinstance(event, h11.Request):
            # h11 bounds a head that arrives in pieces; one that arrives whole
            # in a single read is measured here.
            size = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
            if size > MAX_HEAD_BYTES:
                await self._refuse(431, "request head too large")
            return event
        return None  # ConnectionClosed

    async def _next_event(self) -> Any:
        """h11's next event, reading as needed (a protocol error is answered, and ends)."""
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                await self._refuse(exc.error_status_hint, "malformed request")
            if event is h11.NEED_DATA:
                data = bytes(await self._stream.receive_some(MAX_HEAD_BYTES))
                self._h11.receive_data(data)
                continue
            return event

    async def _body(self, timeout_s: float) -> bytes | None:
        """The request's body, if it is all here within ``timeout_s``; None: close."""
        body = bytearray()
        with trio.move_on_after(timeout_s):
            while True:
                event = await self._next_event()
                if isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > MAX_BODY_BYTES:
                        await self._refuse(413, "request body too large")
                elif isinstance(event, h11.EndOfMessage):
                    return bytes(body)
                elif event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                    return None
        return None  # the body did not arrive in time

    async def _refuse(self, status: int, detail: str) -> NoReturn:
        """Answer a request the parser refused (400, 413, 431), and end."""
        if self._h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            refusal = error_response(status, _REFUSALS.get(status, "bad_request"), detail)
            await self._write(raw_response(refusal, head=False))
        raise _Gone

    def _scope(self, kind: str, request: h11.Request, headers: list[tuple[bytes, bytes]]) -> Scope:
        raw_path, _, query = request.target.partition(b"?")
        try:
            path = unquote(raw_path.decode("ascii"))
        except UnicodeDecodeError:
            path = ""
        # The keys the admin app reads (it is the only app served).
        return {"type": kind, "method": request.method.decode("ascii"), "path": path,
                "query_string": query, "headers": headers, "client": self._client}

    async def _http(self, request: h11.Request, headers: list[tuple[bytes, bytes]],
                    body: bytes) -> None:
        first = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if first:
                return first.pop()
            await self._until_disconnect()
            return {"type": "http.disconnect"}

        await self._app(self._scope("http", request, headers), receive, self._answering())
        if self._gone or self._h11.our_state is h11.SEND_RESPONSE:
            raise _Gone  # the client went away (the app may have answered nothing)

    async def _until_disconnect(self) -> None:
        """Return when the client closes its side; bytes it sends meanwhile (a
        pipelined request) are kept for h11, up to a head's worth."""
        buffered = 0
        while True:
            try:
                data = bytes(await self._stream.receive_some(RECEIVE_BYTES))
            except _TRANSPORT_ERRORS:
                # Reset by the client, or closed under us by the server's stop or an
                # eviction: either way the request has no one to answer any more.
                self._gone = True
                return
            if not data:
                return
            buffered += len(data)
            self._h11.receive_data(data)
            if buffered > MAX_HEAD_BYTES:
                await trio.sleep_forever()  # no more reading until the answer is out

    async def _write(self, data: bytes) -> None:
        """Write under the connection's lock, in pieces of WRITE_PIECE bytes each of
        which must be taken within WRITE_STALL_S, else the connection is reset."""
        async with self._send_lock:
            await self._write_locked(data)

    async def _write_locked(self, data: bytes) -> None:
        """Write ``data`` (the caller holds the lock), shielded, in ``WRITE_PIECE`` pieces.

        A piece not taken within ``WRITE_STALL_S`` resets the connection.
        Once the connection is gone (closed, reset, stalled) writes are dropped.
        ASGI servers do so for an app writing to a client that left.
        The serving loop ends the connection when the app returns.
        """
        if self._gone:
            return
        view = memoryview(data)
        try:
            with trio.CancelScope(shield=True):
                for start in range(0, len(view), WRITE_PIECE):
                    with trio.move_on_after(WRITE_STALL_S) as piece:
                        await self._stream.send_all(view[start : start + WRITE_PIECE])
                    if piece.cancelled_caught:
                        reset(self._socket_stream)
                        self._gone = True
                        return
        except _TRANSPORT_ERRORS:
            self._gone = True

    # -- WebSocket -------------------------------------------------------------

    async def _websocket(self, request: h11.Request, headers: list[tuple[bytes, bytes]]) -> None:
        key = _header(headers, b"sec-websocket-key")
        if (request.method != b"GET" or not _valid_key(key)
                or _header(headers, b"sec-websocket-version") != WEBSOCKET_VERSION):
            await self._refuse(400, "bad WebSocket handshake")
        event = await self._next_event()  # a GET's end of message
        if not isinstance(event, h11.EndOfMessage):
            await self._refuse(400, "bad WebSocket handshake")
        assert key is not None  # _valid_key
        first = [{"type": "websocket.connect"}]
        answer = self._answering(close=True)
        disconnected = trio.Event()
        async with trio.open_nursery() as nursery:

            async def receive() -> dict[str, Any]:
                if first:
                    return first.pop()
                await disconnected.wait()  # the stream is one-way: no message is passed on
                return {"type": "websocket.disconnect", "code": 1006}

            async def send(message: Any) -> None:
                kind = message.get("type")
                if kind == "websocket.accept":
                    await self._accept(key)
                    nursery.start_soon(self._read_frames, disconnected)
                elif kind.startswith("websocket.http."):
                    await answer(message)  # the handshake refused
                elif kind == "websocket.send":  # the hub sends text
                    await self._ws_send(TextMessage(message["text"]))
                elif kind == "websocket.close" and self._ws is not None:
                    await self._ws_send(CloseConnection(
                        int(message.get("code", 1000)), message.get("reason") or ""))

            try:
                await self._app(self._scope("websocket", request, headers), receive, send)
            finally:
                nursery.cancel_scope.cancel()
        await self._finish_websocket()

    async def _accept(self, key: bytes) -> None:
        # No Sec-WebSocket-Extensions in the answer: no permessage-deflate, whatever
        # the client offered.
        data = self._h11.send(h11.InformationalResponse(status_code=101, headers=[
            (b"upgrade", b"websocket"),
            (b"connection", b"Upgrade"),
            (b"sec-websocket-accept", generate_accept_token(key)),
        ]))
        trailing, _ = self._h11.trailing_data
        self._ws = WsConnection(ConnectionType.SERVER, extensions=[], trailing_data=trailing)
        await self._write(data)

    def _answering(self, *, close: bool = False) -> Send:
        """An ASGI ``send`` for one answer: its ``http.response.start`` and ``.body``
        messages (or the ``websocket.http.`` ones: a handshake refused) to :meth:`_respond`."""
        started: Any = None

        async def send(message: Any) -> None:
            nonlocal started
            kind = str(message.get("type")).removeprefix("websocket.")
            if kind == "http.response.start":
                started = message
            elif kind == "http.response.body" and started is not None:
                await self._respond(started, message, close=close)
                started = None
        return send

    async def _respond(self, start: Any, body: Any, *, close: bool = False) -> None:
        """Write one whole answer: ASGI's response ``start`` and ``body`` messages (the
        ``http.`` or ``websocket.http.`` ones), with ``date`` (and ``connection: close``)."""
        out = [(n, v) for n, v in start.get("headers", [])]
        out += [(b"date", http_date())] + ([(b"connection", b"close")] if close else [])
        data = self._h11.send(h11.Response(status_code=int(start["status"]), headers=out))
        payload = bytes(body.get("body", b""))
        if payload:
            data += self._h11.send(h11.Data(data=payload))
        await self._write(data + self._h11.send(h11.EndOfMessage()))

    async def _ws_send(self, event: Any) -> None:
        async with self._send_lock:
            ws = self._ws
            if ws is None:
                return
            try:
                data = ws.send(event)
            except LocalProtocolError:
                return  # closing or closed: RFC 6455 allows nothing more
            await self._write_locked(data)

    async def _read_frames(self, disconnected: trio.Event) -> None:
        """Client frames, read until the close: each message is measured and dropped (a
        client has nothing to say on the stream). Answers pings and the close handshake."""
        ws = self._ws
        assert ws is not None
        try:
            size = 0
            ended = False
            while True:
                # First the bytes that came behind the upgrade request (wsproto
                # holds them as trailing data): frames already.
                for event in ws.events():
                    if isinstance(event, Message):
                        size += len(event.data)
                        if size > MAX_MESSAGE_BYTES:
                            await self._ws_send(CloseConnection(CLOSE_TOO_BIG, "message too big"))
                            return
                        if event.message_finished:
                            size = 0
                    elif isinstance(event, Ping):
                        await self._ws_send(event.response())
                    elif isinstance(event, CloseConnection):
                        # Our answer to the client's close (or to a protocol
                        # error wsproto found: 1002), then the app hears of it.
                        await self._ws_send(event.response() if ws.state is
                                            WsState.REMOTE_CLOSING else
                                            CloseConnection(event.code or CLOSE_PROTOCOL_ERROR))
                        return
                if ended:
                    return
                try:
                    data = bytes(await self._stream.receive_some(RECEIVE_BYTES))
                except _TRANSPORT_ERRORS:
                    data = b""
                if ws.state is WsState.CLOSED:
                    return
                ws.receive_data(data or None)
                ended = not data
        finally:
            disconnected.set()

    async def _finish_websocket(self) -> None:
        """After the app: a close frame if none was sent, then a little time for the client's.

        So closing the socket does not reset a connection whose last frames are unread.
        """
        ws = self._ws
        if ws is None or self._gone:
            return
        if ws.state is WsState.OPEN:
            await self._ws_send(CloseConnection(1000))
        if ws.state is WsState.LOCAL_CLOSING:
            with trio.move_on_after(CLOSE_HANDSHAKE_S):
                while ws.state is WsState.LOCAL_CLOSING:
                    data = bytes(await self._stream.receive_some(RECEIVE_BYTES))
                    if not data:
                        break
                    ws.receive_data(data)
                    list(ws.events())  # read for the state they move, then dropped
