"""One encoding and one frame per event, shared by every stream client; a client
whose writes block holds nobody else back (fake transports, virtual time)."""

from __future__ import annotations

from typing import Any

import msgspec
import trio
import trio.testing

from supervisor.admin.stream import (
    ConnectionGone,
    FirstMessage,
    StreamHub,
    StreamSettings,
    encode_json,
    text_frame,
)
from supervisor.status_doc import StatusDocument
from tests.adminserver import counter_value, make_ctx, published
from tests.fakes.snapshot import FakeSnapshot, serve

CLIENTS = 300


class Client:
    """The fake ASGI side (accept and the first message) plus a raw frame writer
    recording the very objects it is given. ``blocked`` makes every raw write wait
    until the connection is reset (a peer that stopped reading)."""

    def __init__(self, port: int, blocked: bool = False) -> None:
        self.peer = ("127.0.0.1", port)
        self.scope = {"type": "websocket", "path": "/v1/stream", "client": self.peer}
        self.asgi: list[dict[str, Any]] = []
        self.frames: list[bytes] = []
        self.blocked = blocked
        self.reset = trio.Event()
        self.inbound_send, self.inbound = trio.open_memory_channel[dict[str, Any]](1)

    async def receive(self) -> dict[str, Any]:
        return await self.inbound.receive()

    async def send(self, message: dict[str, Any]) -> None:
        self.asgi.append(message)

    async def raw(self, frame: bytes) -> None:
        if self.blocked:
            await self.reset.wait()
            raise ConnectionGone("reset")
        self.frames.append(frame)


def decode_frame(frame: bytes) -> dict[str, Any]:
    assert frame[0] == 0x81  # FIN, text
    length, offset = frame[1], 2
    if length == 126:
        length, offset = int.from_bytes(frame[2:4], "big"), 4
    assert len(frame) == offset + length
    doc = msgspec.json.decode(frame[offset:])
    assert isinstance(doc, dict)
    return doc


def test_text_frame_lengths() -> None:
    for size, header in ((0, 2), (125, 2), (126, 4), (65535, 4), (65536, 10)):
        frame = text_frame(b"x" * size)
        assert len(frame) == header + size and frame[0] == 0x81
    assert text_frame(b"x" * 126)[1:4] == bytes((126, 0, 126))
    assert text_frame(b"x" * 65536)[1:10] == bytes((127, 0, 0, 0, 0, 0, 1, 0, 0))


async def test_each_event_is_encoded_once_and_the_same_frame_goes_to_every_client() -> None:
    encodes: list[Any] = []

    def counting_encode(obj: Any) -> bytes:
        encodes.append(obj)
        return encode_json(obj)

    with trio.fail_after(10):
        ctx = make_ctx()
        clients = {("127.0.0.1", 1000 + i): Client(1000 + i) for i in range(CLIENTS)}
        hub = StreamHub(ctx.events, ctx.status, ctx.metrics,
                        raw_sender=lambda peer: clients[peer].raw, encode=counting_encode)
        async with trio.open_nursery() as nursery:
            for client in clients.values():
                nursery.start_soon(hub.serve, client.scope, client.receive, client.send)
            await trio.testing.wait_all_tasks_blocked()
            assert hub.client_count == CLIENTS
            # One first message for all of them: the state did not change in between.
            assert len(encodes) == 1 and isinstance(encodes[0], FirstMessage)
            encodes.clear()
            events = [ctx.events.emit(published(7 + i)) for i in range(5)]
            await trio.testing.wait_all_tasks_blocked()
            # Five events, five encodes, whatever the number of clients.
            assert encodes == events
            firsts = [c.frames for c in clients.values()]
            for k, event in enumerate(events):
                shared = firsts[0][k]
                assert all(frames[k] is shared for frames in firsts)  # the same object
                assert decode_frame(shared)["seq"] == event.seq
            # The handshake's accept and the status message went through ASGI, the same
            # text to every client.
            shared_first = next(iter(clients.values())).asgi[1]["text"]
            for client in clients.values():
                assert [m["type"] for m in client.asgi] == ["websocket.accept", "websocket.send"]
                assert client.asgi[1]["text"] is shared_first
            assert msgspec.json.decode(shared_first)["type"] == "status"
            nursery.cancel_scope.cancel()


async def test_a_blocked_client_is_dropped_and_holds_nobody_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(100):
        ctx = make_ctx()
        settings = StreamSettings(max_buffer=8)
        clients = {("127.0.0.1", 1000 + i): Client(1000 + i, blocked=(i == 0))
                   for i in range(CLIENTS)}
        stuck = clients[("127.0.0.1", 1000)]

        def abort(peer: tuple[str, int]) -> bool:
            clients[peer].reset.set()  # what resetting the TCP connection does to a write
            return True

        hub = StreamHub(ctx.events, ctx.status, ctx.metrics, settings, abort=abort,
                        raw_sender=lambda peer: clients[peer].raw)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hub.monitor)
            for client in clients.values():
                nursery.start_soon(hub.serve, client.scope, client.receive, client.send)
            await trio.testing.wait_all_tasks_blocked()
            # Far more than the stuck client's buffer, each reaching everyone else
            # at once: nobody waits for the stuck one.
            for i in range(3 * settings.max_buffer):
                ctx.events.emit(published(i))
                await trio.testing.wait_all_tasks_blocked()
                assert all(len(c.frames) == i + 1 for c in clients.values() if c is not stuck)
            assert stuck.frames == []
            # It overflowed while its write was blocked: reset (within the close
            # timeout), counted as dropped, gone from the hub.
            with trio.fail_after(settings.close_timeout_s + 2 * settings.monitor_interval_s):
                await stuck.reset.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert counter_value(ctx.metrics.stream_dropped) == 1
            assert hub.client_count == CLIENTS - 1
            nursery.cancel_scope.cancel()


async def test_the_first_message_is_encoded_again_only_when_the_state_changed() -> None:
    encodes: list[Any] = []

    def counting_encode(obj: Any) -> bytes:
        encodes.append(obj)
        return encode_json(obj)

    def first_of(doc: StatusDocument, heartbeat_s: float) -> bytes:
        # What a hub that encodes per client sends: the outward bytes to keep.
        return encode_json(FirstMessage(**msgspec.structs.asdict(doc), heartbeat_s=heartbeat_s))

    with trio.fail_after(10):
        ctx = make_ctx()
        hub = StreamHub(ctx.events, ctx.status, ctx.metrics, encode=counting_encode)
        async with trio.open_nursery() as nursery:
            async def connect() -> Client:
                client = Client(2000 + len(encodes))
                nursery.start_soon(hub.serve, client.scope, client.receive, client.send)
                await trio.testing.wait_all_tasks_blocked()
                return client

            heartbeat = hub.settings.heartbeat_s
            one, two = await connect(), await connect()
            assert one.asgi[1]["text"] == two.asgi[1]["text"]
            assert one.asgi[1]["text"].encode() == first_of(ctx.status(), heartbeat)
            assert len(encodes) == 1
            # A state change: the next client's first message says it, encoded once more.
            serve(ctx.state, FakeSnapshot(9, 1), body_sha256=b"\x00" * 32)
            three, four = await connect(), await connect()
            assert three.asgi[1]["text"] != one.asgi[1]["text"]
            assert three.asgi[1]["text"] == four.asgi[1]["text"]
            assert three.asgi[1]["text"].encode() == first_of(ctx.status(), heartbeat)
            assert [type(obj) for obj in encodes] == [FirstMessage, FirstMessage]
            nursery.cancel_scope.cancel()
