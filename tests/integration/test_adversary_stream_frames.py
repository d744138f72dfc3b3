"""Adversary (issue 16 item 3): the shared raw frames must never be cut in half.

The hub's contract (supervisor/admin/stream.py docstring of ``_write_events``):
"a write in progress is never interrupted, so no frame is ever cut in half".
A client that half-closes (``shutdown(SHUT_WR)``, or a browser tab sending its
FIN while it still reads) makes hypercorn deliver ``websocket.disconnect``; the
hub's reader task then cancels the nursery whose body is the raw write, and
``send_all`` stops in the middle of a frame. The bytes the client reads then end
inside a frame: a corrupt stream, never a close frame.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios

import trio

from supervisor.admin.stream import StreamSettings
from tests.floods import websocket_request
from tests.integration.test_admin_support import make_ctx, running_admin
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
            ctx.events.publish("published", {"revision": 7, "note": "x" * (16 << 20)})
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
