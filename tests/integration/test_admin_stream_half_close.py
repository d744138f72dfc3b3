"""The stream's shared raw frames are never cut in half, whatever the client does.

The hub's contract (supervisor/admin/stream.py docstring of ``_write_events``):
"a write in progress is never interrupted, so no frame is ever cut in half".
A client that half-closes (``shutdown(SHUT_WR)``, or a browser tab sending its
FIN while it still reads) makes the server deliver ``websocket.disconnect``
while a raw write may be in progress; the bytes the client reads still end on
a frame boundary, no data frame follows the close frame, and a client closing
during a blocked write is no server error.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios

import pytest
import trio

from supervisor.admin.context import AdminContext
from supervisor.admin.stream import StreamSettings
from tests.adminserver import make_ctx, published, rejected, running_admin
from tests.floods import websocket_request
from tests.polling import poll_until


def parse_frames(data: bytes) -> tuple[list[tuple[int, int]], bytes]:
    """Server frames in ``data`` as (opcode, payload length); the unparsed rest."""
    frames: list[tuple[int, int]] = []
    i = 0
    while True:
        if len(data) - i < 2:
            break
        b0, b1 = data[i], data[i + 1]
        assert not b1 & 0x80, "server frames are never masked"
        n = b1 & 0x7F
        head = 2
        if n == 126:
            if len(data) - i < 4:
                break
            n = int.from_bytes(data[i + 2:i + 4], "big")
            head = 4
        elif n == 127:
            if len(data) - i < 10:
                break
            n = int.from_bytes(data[i + 2:i + 10], "big")
            head = 10
        if len(data) - i < head + n:
            break
        frames.append((b0 & 0x0F, n))
        i += head + n
    return frames, data[i:]


def readable_bytes(sock: socket.socket) -> int:
    buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, struct.pack("i", 0))
    return int(struct.unpack("i", buf)[0])


@pytest.mark.chaos  # over 10 s through the real process: run by CI's `pytest -m chaos`
async def test_a_half_closing_client_never_reads_a_frame_cut_in_half() -> None:
    with trio.fail_after(30):
        ctx = make_ctx()
        settings = StreamSettings(stall_timeout_s=60.0, close_timeout_s=60.0)
        async with running_admin(ctx, settings=settings) as srv:
            sock = trio.socket.socket()
            # A small window: the big frame below cannot fit in the buffers.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect((srv.host, srv.port))
            stream = trio.SocketStream(sock)
            await stream.send_all(websocket_request())
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            head, _, data = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101"), head
            while not parse_frames(data)[0]:
                data += await stream.receive_some(65536)
            frames, data = parse_frames(data)
            assert [op for op, _ in frames] == [1]  # the status message

            # One big event: its raw write blocks on the client's full window.
            ctx.events.emit(rejected(7, detail="x" * (16 << 20)))
            raw = sock._sock  # type: ignore[attr-defined]
            await poll_until(lambda: readable_bytes(raw) > 0)  # the write has begun

            # The client is done sending (FIN) but still reads to the end.
            sock.shutdown(socket.SHUT_WR)
            while True:
                chunk = await stream.receive_some(1 << 20)
                if not chunk:
                    break
                data += chunk
            frames, rest = parse_frames(data)
            # Every byte the client got belongs to a whole frame: the event's
            # frame written to its end (then, ideally, a close frame).
            assert rest == b"", (
                f"stream ends inside a frame: {len(rest)} bytes of a "
                f"{16 << 20}-byte event frame, frames before it {frames}"
            )
            stream.socket.close()


def masked_close_frame(code: int = 1000) -> bytes:
    """A client's close frame (clients must mask; an all-zero mask keeps it readable)."""
    payload = code.to_bytes(2, "big")
    return bytes((0x88, 0x80 | len(payload))) + b"\0\0\0\0" + payload


async def _close_round(host: str, port: int, ctx: AdminContext, rev: int) -> list[int]:
    """One client that closes while its raw write is blocked; the opcodes it
    reads after the server's close frame."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((host, port))
    stream = trio.SocketStream(sock)
    await stream.send_all(websocket_request())
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    _, _, data = data.partition(b"\r\n\r\n")
    while not parse_frames(data)[0]:
        data += await stream.receive_some(65536)
    _, data = parse_frames(data)

    # A big event blocks the raw write (it holds the send lock); more events
    # wait in the client's buffer behind it.
    ctx.events.emit(rejected(rev, detail="x" * (4 << 20)))
    raw = sock._sock  # type: ignore[attr-defined]
    await poll_until(lambda: readable_bytes(raw) > 0)
    for i in range(20):
        ctx.events.emit(published(rev + 1 + i))
    # The client closes (hypercorn's reply waits behind the blocked write for
    # the send lock), then reads everything.
    await stream.send_all(masked_close_frame())
    while True:
        chunk = await stream.receive_some(1 << 20)
        if not chunk:
            break
        data += chunk
    stream.socket.close()
    frames, rest = parse_frames(data)
    ops = [op for op, _ in frames]
    assert 8 in ops, f"no close frame: {ops}, {len(rest)} bytes left"
    return ops[ops.index(8) + 1:]


@pytest.mark.chaos  # over 10 s through the real process: run by CI's `pytest -m chaos`
async def test_no_data_frame_follows_the_close_frame_after_a_client_closes() -> None:
    # RFC 6455 section 5.5.1: after sending a Close frame, the endpoint MUST NOT
    # send any more data frames. hypercorn answers a client's close on its own
    # (under the send lock), but the hub's raw writes know nothing of it: the
    # next queued event's frame can take the lock right after the close reply.
    # A race, so several rounds (about one in three shows it).
    with trio.fail_after(60):
        ctx = make_ctx()
        settings = StreamSettings(stall_timeout_s=60.0, close_timeout_s=60.0)
        async with running_admin(ctx, settings=settings) as srv:
            after = [await _close_round(srv.host, srv.port, ctx, 100 * r) for r in range(12)]
            assert all(a == [] for a in after), f"data frames after the close frame: {after}"


@pytest.mark.chaos  # over 10 s through the real process: run by CI's `pytest -m chaos`
async def test_a_client_closing_during_a_blocked_write_is_not_a_server_error(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # The same race seen from the log: the hub's raw send_all starts while
    # hypercorn's connection close is in send_eof (not under the send lock), so
    # trio raises BusyResourceError, which send_raw does not turn into
    # ConnectionGone: an ordinary client close is logged as "stream client
    # failed" at error level with a traceback.
    with trio.fail_after(60):
        ctx = make_ctx()
        settings = StreamSettings(stall_timeout_s=60.0, close_timeout_s=60.0)
        async with running_admin(ctx, settings=settings) as srv:
            for r in range(12):
                await _close_round(srv.host, srv.port, ctx, 100 * r)
    out, err = capfd.readouterr()
    assert "BusyResourceError" not in out + err
    assert "stream client failed" not in out + err
