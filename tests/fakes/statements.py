"""A root's signed statements made in-process, and a hostile upstream that replays them.

:class:`Root` signs statements exactly as a root's cache export does
(:func:`~supervisor.sinks.lkg.encode_header` with a
:class:`~supervisor.sinks.lkg.Statement`), so what the tests replay is
byte-for-byte the genuine format. :class:`HostileUpstream` is a plain HTTP/1.1
server on loopback (HTTPS given a server context), written by hand so that it can send what no well-behaved
server would: a non-ASCII ``ETag``, a nested gzip bomb, an endless chunked 500,
a body dripped one byte at a time, a flood of WebSocket hints. It serves
``GET /v1/revision`` from :attr:`HostileUpstream.data` (captured genuine bytes,
or made by a :class:`Root`) and answers 304 to a matching ``If-None-Match``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import ssl
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import nacl.signing
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

from supervisor.sinks.lkg import Statement, encode_file, encode_header, key_id_of
from supervisor.sinks.lkg.fileformat import Header, decode_file

__all__ = ["BODY", "HostileUpstream", "Root", "gzip_bomb", "statement_of", "verify"]

BODY = b'{"schema_version": 1, "aliases": {"a": {"upstream": "https://a.example/"}}}'


@dataclass
class Root:
    """A root's signing key and control-plane identity."""

    key: nacl.signing.SigningKey = field(default_factory=nacl.signing.SigningKey.generate)
    identity: str = "sqlite:1:1"

    def sign(self, revision: int, sequence: int, body: bytes = BODY, *,
             issued_at: datetime | None = None, ttl_s: float = 300.0,
             schema_version: int = 1) -> bytes:
        issued = issued_at or datetime.now(UTC)
        statement = Statement(revision, hashlib.sha256(body).hexdigest(), sequence,
                              self.identity, issued, issued + timedelta(seconds=ttl_s))
        header = encode_header(revision=revision, generation=1, schema_version=schema_version,
                               created_at=issued, body=body,
                               key_id=key_id_of(self.key.verify_key), statement=statement)
        return encode_file(header, body, self.key)

    def sign_fields(self, revision: int, sequence: int, body: bytes = BODY, /,
                    **fields: object) -> bytes:
        """A version 2 file whose header fields are ``fields`` over genuine ones, as given.

        What no root writes (a time with any offset, a string where a number
        goes), signed with the root's key: the follower must judge the fields.
        """
        issued = datetime.now(UTC)
        header: dict[str, object] = {
            "format_version": 2, "revision": revision, "generation": 1, "schema_version": 1,
            "created_at": issued.isoformat(), "body_length": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "key_id": key_id_of(self.key.verify_key), "sequence": sequence,
            "root": self.identity, "issued_at": issued.isoformat(),
            "expires_at": (issued + timedelta(seconds=300)).isoformat()}
        header.update(fields)
        return encode_file(json.dumps(header).encode(), body, self.key)


def statement_of(data: bytes) -> Statement:
    """The statement of genuine signed bytes (verified against the key that signed them)."""
    from supervisor.sinks.lkg.fileformat import MAGIC

    start = len(MAGIC) + 4
    length = int.from_bytes(data[len(MAGIC):start], "big")
    import msgspec

    header = msgspec.json.decode(data[start:start + length], type=Header)
    statement = header.statement(data)
    assert statement is not None
    return statement


def verify(data: bytes, key: nacl.signing.VerifyKey) -> Header:
    header, _ = decode_file(data, "<test>", {key_id_of(key): key})
    return header


class HostileUpstream:
    """``GET /v1/revision`` (and ``/v1/stream``) on loopback, misbehaving as told.

    ``mode``: ``"genuine"``; ``"etag"`` (the body with ``ETag: "\\xe9"``);
    ``"gzip_bomb"`` (``Content-Encoding: gzip, gzip`` over a nested bomb);
    ``"endless_500"`` (a chunked 500 that never ends); ``"drip"`` (a 200 whose
    body comes one byte every ``drip_s``); ``"silent"`` (accepts, says nothing);
    ``"unavailable"`` (503). :meth:`flood` sends hints to each stream client.
    """

    def __init__(self, data: bytes = b"", *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.data = data
        self.ssl_context = ssl_context  # set: HTTPS with it
        self.mode = "genuine"
        self.drip_s = 8.0
        self.hint_flood = 0
        self._flood_requested = trio.Event()
        #: Set once a flood was written to a client (its socket took every byte).
        self.flood_sent = trio.Event()
        self.requests = 0
        self.full = 0
        self.not_modified = 0
        self.port = 0

    def flood(self, hints: int) -> None:
        """Send ``hints`` published events to every stream client, connected or not yet."""
        self.hint_flood = hints
        self._flood_requested.set()

    @property
    def url(self) -> str:
        scheme = "http" if self.ssl_context is None else "https"
        return f"{scheme}://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        served: list[trio.abc.Listener[trio.abc.Stream]] = list(listeners)
        if self.ssl_context is not None:
            served = [trio.SSLListener(listener, self.ssl_context) for listener in listeners]
        task_status.started()
        await trio.serve_listeners(self._handle, served)

    async def _handle(self, stream: trio.abc.Stream) -> None:
        try:
            await self._answer(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the follower hung up: exactly what it should do to a hostile answer
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream: trio.abc.Stream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        request_line, *lines = data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in
                   (line.split(":", 1) for line in lines if ":" in line)}
        path = request_line.split(" ")[1]
        if path.startswith("/v1/stream"):
            await self._stream(stream, data)
            return
        self.requests += 1
        mode = self.mode
        etag = statement_of(self.data).etag() if self.data else '"none"'
        if mode == "silent":
            await trio.sleep_forever()
        if mode == "unavailable":
            await _send(stream, 503, b'{"error": "no_snapshot"}')
            return
        if mode == "endless_500":
            await stream.send_all(b"HTTP/1.1 500 Boom\r\ntransfer-encoding: chunked\r\n\r\n")
            block = b"x" * 65536
            chunk = f"{len(block):x}\r\n".encode() + block + b"\r\n"
            while True:
                await stream.send_all(chunk)
        if mode == "genuine" and headers.get("if-none-match") == etag:
            self.not_modified += 1
            await _send(stream, 304, b"", [("etag", etag.encode())])
            return
        self.full += 1
        if mode == "etag":
            await _send(stream, 200, self.data, [("etag", b'"\xe9"')])
        elif mode == "gzip_bomb":
            bomb = gzip_bomb()
            await _send(stream, 200, bomb, [("content-encoding", b"gzip, gzip")])
        elif mode == "drip":
            head = (f"HTTP/1.1 200 OK\r\ncontent-length: {len(self.data)}\r\netag: {etag}\r\n"
                    "connection: close\r\n\r\n")
            await stream.send_all(head.encode())
            for index in range(len(self.data)):
                await stream.send_all(self.data[index:index + 1])
                await trio.sleep(self.drip_s)
        else:
            await _send(stream, 200, self.data, [("etag", etag.encode())])

    async def _stream(self, stream: trio.abc.Stream, head: bytes) -> None:
        """The WebSocket handshake (wsproto), then ``hint_flood`` published events."""
        connection = WSConnection(ConnectionType.SERVER)
        connection.receive_data(head)
        for event in connection.events():
            if isinstance(event, Request):
                await stream.send_all(connection.send(AcceptConnection()))
                break
        else:
            return
        await self._flood_requested.wait()
        payload = json.dumps({"type": "published", "revision": 1})
        batch = b"".join(connection.send(TextMessage(payload)) for _ in range(1000))
        sent = 0
        while sent < self.hint_flood:
            await stream.send_all(batch)
            sent += 1000
        self.flood_sent.set()
        await trio.sleep_forever()


_BOMB: list[bytes] = []


def gzip_bomb() -> bytes:
    """``gzip(gzip(1 GiB of zeros))``: a few kilobytes on the wire (made once)."""
    if not _BOMB:
        # Concatenated gzip members decompress to the concatenation: 1024 x 1 MiB.
        inner = gzip.compress(b"\0" * (1 << 20), compresslevel=9) * 1024
        _BOMB.append(gzip.compress(inner, compresslevel=9))
    return _BOMB[0]


async def _send(stream: trio.abc.Stream, status: int, body: bytes,
                headers: list[tuple[str, bytes]] | None = None) -> None:
    head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\nconnection: close\r\n"
    raw = head.encode() + b"".join(k.encode() + b": " + v + b"\r\n"
                                   for k, v in headers or []) + b"\r\n"
    await stream.send_all(raw + body)
