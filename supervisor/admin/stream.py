"""``WS /v1/stream``: the live event stream, one bounded queue per client.

:class:`StreamHub` holds the clients and writes each event to them.
Operators: docs/admin-api.md, "WS /v1/stream" (the messages and close codes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import msgspec
import trio
from wsproto.frame_protocol import FrameProtocol

from supervisor.events import Event, EventBus, Subscription, utc_now_iso
from supervisor.logs import get_logger
from supervisor.status_doc import StatusDocument
from supervisor.telemetry import Metrics

__all__ = ["CLOSE_GOING_AWAY", "CLOSE_POLICY", "CLOSE_TOO_SLOW", "ConnectionGone", "Encoded",
           "FirstMessage", "RawSend", "Receive", "Scope", "Send", "StreamHub", "StreamSettings",
           "encode_json", "text_frame", "until_disconnect"]

log = get_logger("admin.stream")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

CLOSE_GOING_AWAY = 1001
#: A client whose token a reload retired (RFC 6455 "policy violation").
CLOSE_POLICY = 1008
CLOSE_TOO_SLOW = 1013

# Writes bytes that are already a complete WebSocket frame; ConnectionGone when
# the connection is gone.
RawSend = Callable[[bytes], Awaitable[None]]


class ConnectionGone(Exception):
    """A raw write found the connection closed or reset (RawSend's only failure)."""


def text_frame(payload: bytes) -> bytes:
    """``payload`` (UTF-8) as one final, unmasked WebSocket text frame (RFC 6455,
    section 5.2): what a server sends, identical for every client."""
    return bytes(FrameProtocol(client=False, extensions=[]).send_data(payload.decode()))


class Encoded:
    """One message, encoded once: its text (for ASGI) and its frame (for raw writes)."""

    __slots__ = ("frame", "text")

    def __init__(self, payload: bytes) -> None:
        self.text = payload.decode()
        self.frame = text_frame(payload)


def _fallback(obj: Any) -> Any:
    # Events are meant to be JSON-ready; a stray value (a Path, an enum) must
    # degrade to its text rather than end the stream for every client.
    return str(obj)


_encoder = msgspec.json.Encoder(enc_hook=_fallback)


def encode_json(obj: Any) -> bytes:
    """Compact JSON; values msgspec cannot encode are rendered with ``str``."""
    return _encoder.encode(obj)


class FirstMessage(StatusDocument, tag_field="type", tag="status", kw_only=True):
    """A stream's first message: the ``/status`` document, tagged, and the heartbeat period."""

    heartbeat_s: float


@dataclass(frozen=True)
class StreamSettings:
    """Tunables of the stream; the defaults suit one operator's ``watch`` and a few tools."""

    max_buffer: int = 256  # events buffered per client before it counts as too slow
    heartbeat_s: float = 15.0  # a ping after this long without any other message
    # Further handshakes are refused with 503. None: as many as the descriptor
    # limit allows (supervisor.admin.limits derives it); a number only lowers that.
    max_clients: int | None = None
    stall_timeout_s: float = 10.0  # a single write blocked this long: reset the connection
    close_timeout_s: float = 2.0  # an overflowed client's write blocked this long: reset
    monitor_interval_s: float = 0.5  # how often the monitor looks for blocked writes


@dataclass(eq=False, slots=True)
class _Client:
    sub: Subscription
    peer: tuple[str, int]
    sending_since: float | None = None
    wait_scope: trio.CancelScope | None = None
    aborted: bool = False
    dropped: bool = False
    # Whether the credentials it opened with still let it in (asked after a token reload).
    allowed: Callable[[], bool] = lambda: True
    revoked: bool = False

    def wake(self) -> None:
        """Cut short its wait for an event (never a write in progress)."""
        if self.wait_scope is not None:
            self.wait_scope.cancel()


class StreamHub:
    """Every connected stream client; the fan-out from the bus to the sockets.

    ``status`` builds the first message's state (the ``/status`` document).
    ``abort(peer)`` resets the TCP connection of the client at ``peer`` (ASGI
    ``scope["client"]``) and says whether it found one; the server provides it.

    Each message is encoded once, into one complete frame (:func:`text_frame`).
    Server frames are unmasked, so every client gets that same ``bytes`` object.
    ``raw_sender`` writes it: the connection's raw write, under its own write lock.
    So frames never interleave, and nothing is per client but the write itself.
    That keeps 10,000 subscribers near a bare trio-websocket broadcast (``bench/bench_stream.py``).
    Without a raw sender (tests' fake transports) the text goes through ASGI ``websocket.send``.
    No permessage-deflate is negotiated, so the uncompressed frame is what clients expect.
    An event never waits for a client: :meth:`EventBus.emit` only offers to bounded buffers.
    """

    def __init__(self, events: EventBus, status: Callable[[], StatusDocument], metrics: Metrics,
                 settings: StreamSettings | None = None, *,
                 abort: Callable[[tuple[str, int]], bool] | None = None,
                 raw_sender: Callable[[tuple[str, int]], RawSend | None] | None = None,
                 encode: Callable[[Any], bytes] = encode_json,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.settings = settings if settings is not None else StreamSettings()
        self._events = events
        self._status = status
        self._metrics = metrics
        self._abort_peer = abort
        self._raw_sender = raw_sender
        self._encode_json = encode
        self._clock = clock
        self._clients: set[_Client] = set()
        self._closing = trio.Event()
        self._empty = trio.Event()
        self._empty.set()
        # One encoding per event, not one per client: with 10,000 clients the
        # encode would otherwise dominate the fan-out. Keyed by the bus's seq.
        self._encoded: OrderedDict[int, Encoded] = OrderedDict()
        # The last first message and its encoding: clients connecting while the state
        # stays the same (a fleet reconnecting at once) share it.
        self._first: tuple[FirstMessage, Encoded] | None = None

    # -- reading -------------------------------------------------------------

    @property
    def client_count(self) -> int:
        return len(self._clients)

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def full(self) -> bool:
        limit = self.settings.max_clients
        return limit is not None and len(self._clients) >= limit

    # -- one client ----------------------------------------------------------

    async def serve(self, scope: Scope, receive: Receive, send: Send, *,
                    allowed: Callable[[], bool] = lambda: True) -> None:
        """Run one accepted-to-be client: the app has read ``websocket.connect``
        and checked the token; this accepts, streams, and closes.

        The client subscribes in the synchronous step that builds the first message.
        So no event falls between the two, and none is counted twice.

        ``allowed()`` says whether its credentials still let it in: asked by
        :meth:`revoke`, a client it refuses is closed with 1008.
        """
        peer: tuple[str, int] = scope["client"]  # the admin server always gives it
        # Snapshot the state and subscribe in one synchronous step (no checkpoint
        # between): an event is either reflected in the first message or
        # delivered after it, never both.
        first_message = self._first_message()
        raw = self._raw_sender(peer) if self._raw_sender is not None else None
        sub = self._events.subscribe(max_buffer=self.settings.max_buffer)
        client = _Client(sub, peer, allowed=allowed)
        if not self._clients:
            self._empty = trio.Event()
        self._clients.add(client)
        self._metrics.stream_clients.set(len(self._clients))
        try:
            await send({"type": "websocket.accept"})
            # Through the connection: its handshake response must be out first.
            await self._send(client, send, None, first_message)
            close: tuple[int, str] | None = None
            async with trio.open_nursery() as nursery:
                # One-way: what the client sends is read (its queue never fills) and dropped.
                nursery.start_soon(until_disconnect, receive, nursery.cancel_scope)
                try:
                    close = await self._write_events(client, send, raw)
                except ConnectionGone:
                    close = None
                nursery.cancel_scope.cancel()
            if close is not None and not client.aborted:
                code, reason = close
                await send({"type": "websocket.close", "code": code, "reason": reason})
        finally:
            sub.close()
            self._clients.discard(client)
            self._metrics.stream_clients.set(len(self._clients))
            if not self._clients:
                self._empty.set()

    async def _write_events(self, client: _Client, send: Send,
                            raw: RawSend | None) -> tuple[int, str] | None:
        """Forward events until the client must be closed: returns the close code and
        reason, or None when the connection is already gone.

        An overflowed buffer (``max_buffer`` events) closes with 1013: the client missed events.
        :attr:`Metrics.stream_dropped` counts these. A ping follows ``heartbeat_s`` of silence.
        """
        heartbeat = self.settings.heartbeat_s
        receive = client.sub.receive
        while True:
            if client.aborted:
                return None
            if client.sub.overflowed:
                self._count_drop(client)
                return (CLOSE_TOO_SLOW, "client too slow")
            if self._closing.is_set():
                return (CLOSE_GOING_AWAY, "going away")
            if client.revoked:
                return (CLOSE_POLICY, "token no longer valid")
            event: Event | None = None
            try:
                try:
                    # Fast path, no cancel scope: an event is already waiting.
                    event = receive.receive_nowait()
                except trio.WouldBlock:
                    # Only the wait is cancellable from outside (close_all, abort); a
                    # write in progress is never interrupted, so no frame is ever cut
                    # in half. The scope's deadline is the heartbeat.
                    with trio.CancelScope(deadline=trio.current_time() + heartbeat) as wait_scope:
                        client.wait_scope = wait_scope
                        event = await receive.receive()
                    client.wait_scope = None
                    if wait_scope.cancelled_caught and (
                            client.aborted or client.revoked or self._closing.is_set()):
                        continue
            except trio.EndOfChannel:
                # The bus closes a channel only when it overflows (said at the loop's top).
                if client.sub.overflowed:
                    continue
                return (CLOSE_GOING_AWAY, "going away")
            # No event after a whole heartbeat period: a ping.
            message = self._encode(event) if event is not None else _ping()
            await self._send(client, send, raw, message)

    async def _send(
        self, client: _Client, send: Send, raw: RawSend | None, message: Encoded
    ) -> None:
        client.sending_since = self._clock()
        try:
            if raw is not None:
                await raw(message.frame)
            else:
                await send({"type": "websocket.send", "text": message.text})
        finally:
            client.sending_since = None

    def _first_message(self) -> Encoded:
        """The first message of the state now, encoded once per state: a client finding
        the document equal to the last one encoded is given those very bytes."""
        first = FirstMessage(**msgspec.structs.asdict(self._status()),
                             heartbeat_s=self.settings.heartbeat_s)
        held = self._first
        if held is not None and held[0] == first:
            return held[1]
        message = Encoded(self._encode_json(first))
        self._first = (first, message)
        return message

    def _encode(self, event: Event) -> Encoded:
        seq = event.seq
        message = self._encoded.get(seq)
        if message is None:
            message = Encoded(self._encode_json(event))
            self._encoded[seq] = message
            # A client more than max_buffer events behind has overflowed, so
            # older encodings are (almost) never asked for again; a miss only
            # costs one more encode.
            while len(self._encoded) > max(self.settings.max_buffer, 16):
                self._encoded.popitem(last=False)
        return message

    # -- bookkeeping ---------------------------------------------------------

    def _count_drop(self, client: _Client) -> None:
        if not client.dropped:
            client.dropped = True
            self._metrics.stream_dropped.inc()
            log.warning("stream client too slow; closing", peer="{}:{}".format(*client.peer))

    def _abort(self, client: _Client) -> None:
        client.aborted = True
        client.wake()
        if self._abort_peer is not None:
            self._abort_peer(client.peer)

    # -- the whole hub -------------------------------------------------------

    def abort_stalled(self) -> int:
        """Reset the connections of clients whose current write has been blocked too
        long; returns how many. Called by :meth:`monitor`; tests call it directly.

        A client that stops reading cannot even be sent a close frame.
        The socket write is shielded and blocks once the kernel's buffers are full.
        Too long is ``stall_timeout_s``, or ``close_timeout_s`` once the client overflowed.
        The reset (the ``abort`` callback) unblocks the write.
        """
        now, s = self._clock(), self.settings
        stalled = [c for c in self._clients if c.sending_since is not None and not c.aborted
                   and now - c.sending_since > (min(s.stall_timeout_s, s.close_timeout_s)
                                                if c.sub.overflowed else s.stall_timeout_s)]
        for client in stalled:
            self._count_drop(client)
            self._abort(client)
        return len(stalled)

    async def monitor(self) -> None:
        """Run :meth:`abort_stalled` periodically, until cancelled."""
        while True:
            await trio.sleep(self.settings.monitor_interval_s)
            self.abort_stalled()

    def revoke(self) -> None:
        """Close, with 1008, every client whose credentials no longer let it in (a reload)."""
        for client in list(self._clients):
            if not client.revoked and not client.allowed():
                client.revoked = True
                client.wake()

    async def close_all(self, timeout_s: float) -> None:
        """Close every client with 1001 "going away" and refuse new ones.

        Waits up to ``timeout_s`` for the close frames to go out; clients whose
        writes are still blocked after that have their connections reset.
        """
        self._closing.set()
        for client in list(self._clients):
            client.wake()
        with trio.move_on_after(timeout_s):
            await self._empty.wait()
        for client in list(self._clients):
            self._abort(client)


async def until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    """Read (and drop) a client's ASGI messages until it disconnects, then cancel ``scope``.

    A server's receive blocks until there is something to read; the checkpoint keeps
    one that does not from starving the event loop.
    """
    while not str((await receive()).get("type")).endswith(".disconnect"):
        await trio.lowlevel.checkpoint()
    scope.cancel()


def _ping() -> Encoded:
    """The application-level heartbeat: ASGI cannot send protocol pings.

    Client libraries rarely surface those anyway. A message every client sees also
    proves the whole path alive: event loop, hub, connection.
    """
    return Encoded(encode_json({"type": "ping", "at": utc_now_iso()}))

