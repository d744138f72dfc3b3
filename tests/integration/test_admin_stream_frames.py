"""The shared raw frames through the real admin server, read by WebSocket clients
that did and did not offer permessage-deflate (wsproto as the client): the server
negotiates no extension, so every client reads the same uncompressed frames."""

from __future__ import annotations

import zlib

import msgspec
import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Request,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate

from tests.adminserver import make_ctx, published, rejected, running_admin


class WsprotoClient:
    def __init__(self, stream: trio.SocketStream, deflate: bool) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.deflate = deflate
        self.pending: list[object] = []
        self.accepted: AcceptConnection | None = None

    async def open(self, host: str, port: int) -> None:
        extensions = [PerMessageDeflate()] if self.deflate else []
        await self.stream.send_all(self.ws.send(
            Request(host=f"{host}:{port}", target="/v1/stream", extensions=extensions)))
        while self.accepted is None:
            await self._pump()
            for event in list(self.pending):
                if isinstance(event, AcceptConnection):
                    self.accepted = event
                    self.pending.remove(event)

    async def _pump(self) -> None:
        data = await self.stream.receive_some(65536)
        assert data, "server closed"
        self.ws.receive_data(data)
        self.pending.extend(self.ws.events())

    async def message(self) -> dict[str, object]:
        text = ""
        while True:
            while not self.pending:
                await self._pump()
            event = self.pending.pop(0)
            assert not isinstance(event, CloseConnection), event
            if isinstance(event, TextMessage):
                text += event.data
                if event.message_finished:
                    doc = msgspec.json.decode(text)
                    assert isinstance(doc, dict)
                    return doc


@pytest.mark.parametrize("deflate", [False, True])
async def test_clients_with_and_without_permessage_deflate_read_the_shared_frames(
    deflate: bool,
) -> None:
    with trio.fail_after(20):
        ctx = make_ctx()
        async with running_admin(ctx) as srv:
            clients = []
            for _ in range(3):
                client = WsprotoClient(await trio.open_tcp_stream(srv.host, srv.port), deflate)
                await client.open(srv.host, srv.port)
                negotiated = [e.name for e in client.accepted.extensions] if client.accepted else []
                assert negotiated == []  # the offer is refused: nothing is ever inflated
                assert (await client.message())["type"] == "status"
                clients.append(client)
            for i in range(3):
                ctx.events.emit(rejected(10 + i, detail="x" * 200 * i))
            for client in clients:
                docs = [await client.message() for _ in range(3)]
                assert [d["revision"] for d in docs] == [10, 11, 12]
                assert docs[2]["detail"] == "x" * 400  # a 126+ byte frame too
            for client in clients:
                await client.stream.aclose()
            srv.stop()


async def test_a_deflate_offer_gets_no_extension_and_a_compressed_frame_closes_1002() -> None:
    """The answer to an offer of permessage-deflate names no extension, the server's
    frames are uncompressed (RSV1 clear), and a client frame with RSV1 set (what a
    compressed frame is) ends the connection with 1002 instead of being inflated."""
    with trio.fail_after(20):
        ctx = make_ctx()
        async with running_admin(ctx) as srv:
            stream = await trio.open_tcp_stream(srv.host, srv.port)
            await stream.send_all(
                (f"GET /v1/stream HTTP/1.1\r\nHost: {srv.host}:{srv.port}\r\n"
                 "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                 "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n"
                 ).encode())
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            head, rest = data.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 101"), head
            assert b"sec-websocket-extensions" not in head.lower()
            buffer = bytearray(rest)

            async def frame() -> tuple[int, bytes]:
                while True:
                    if len(buffer) >= 2:
                        first, length, offset = buffer[0], buffer[1], 2
                        if length == 126:
                            length, offset = int.from_bytes(buffer[2:4], "big"), 4
                        if len(buffer) >= offset + length:
                            payload = bytes(buffer[offset:offset + length])
                            del buffer[:offset + length]
                            return first, payload
                    chunk = await stream.receive_some(65536)
                    assert chunk, "closed before a whole frame"
                    buffer.extend(chunk)

            first, _ = await frame()
            assert first == 0x81  # FIN, text, not compressed
            ctx.events.emit(published(7))
            first, payload = await frame()
            assert first == 0x81
            assert msgspec.json.decode(payload)["revision"] == 7
            # FIN + RSV1 + text, masked, a deflate stream's bytes as payload.
            compressed = zlib.compressobj(wbits=-15)
            body = compressed.compress(b"x" * 100_000) + compressed.flush(zlib.Z_SYNC_FLUSH)
            mask = b"\0\0\0\0"
            assert len(body) < 126
            await stream.send_all(bytes((0xC1, 0x80 | len(body))) + mask + body)
            first, payload = await frame()
            assert first == 0x88  # close
            assert int.from_bytes(payload[:2], "big") == 1002
            await stream.aclose()
            srv.stop()


async def test_a_close_frame_in_the_same_packet_as_the_handshake_is_answered_at_once() -> None:
    """Bytes that arrive behind the upgrade request are the WebSocket's first frames:
    they are acted on at once, not when the client next sends something."""
    with trio.fail_after(20):
        async with running_admin(make_ctx()) as srv:
            stream = await trio.open_tcp_stream(srv.host, srv.port)
            close = bytes((0x88, 0x82)) + b"\0\0\0\0" + (1000).to_bytes(2, "big")
            await stream.send_all(
                (f"GET /v1/stream HTTP/1.1\r\nHost: {srv.host}:{srv.port}\r\n"
                 "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                 "\r\n").encode() + close)
            received = b""
            with trio.move_on_after(3):
                while chunk := await stream.receive_some(65536):
                    received += chunk
            head, _, frames = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101"), head
            assert b"\x88\x02\x03\xe8" in frames  # our close frame, 1000, answering theirs
            assert chunk == b""  # and the server closed the connection
            await stream.aclose()
            srv.stop()
