"""Follower mode, real processes: only the follower's WebSocket hint is cut.

A proxy stands between a follower and its upstream. It forwards the plain HTTP
requests (``GET /v1/revision``, the correctness path) and cuts the WebSocket
upgrade of ``/v1/stream`` (the wake-up hint) in one of two ways:

- ``reset``: the upgrade request's connection is reset (an upstream stream that
  is unreachable: the hint child logs an outage and retries with backoff);
- ``silent``: the handshake completes (a well-formed 101) and then nothing ever
  comes (a half-open stream: the hint child believes it is following).

Either way each publish on the upstream must still reach the follower by
polling alone (``poll_interval_s`` 0.3 s here; the whole scenario is bounded
by its deadline, not timed), and the follower must have tried its stream.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import struct
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.followers import make_node, wait_active
from tests.httpproxy import answer, forward_get, read_head
from tests.proc import EXAMPLE, acli, free_port, run_daemon

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class StreamCuttingProxy:
    """Forwards plain HTTP GETs to ``upstream``; cuts WebSocket upgrades (``cut``)."""

    def __init__(self, upstream: str, cut: str) -> None:
        self.upstream = upstream
        self.cut = cut
        self.upgrades = 0
        self.forwarded = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        head = await read_head(stream)
        if head is None:
            return
        request_line, headers = head
        if headers.get("upgrade", "").lower() == "websocket":
            self.upgrades += 1
            await self._cut(stream, headers.get("sec-websocket-key", ""))
            return
        response = await forward_get(self.upstream, request_line, headers)
        self.forwarded += 1
        await answer(stream, response, response.content)

    async def _cut(self, stream: trio.SocketStream, key: str) -> None:
        if self.cut == "reset":
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                     struct.pack("ii", 1, 0))
            stream.socket.close()
            return
        accept = base64.b64encode(hashlib.sha1(key.encode() + WS_GUID).digest()).decode()
        await stream.send_all(
            ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
        await trio.sleep_forever()  # silent until the test ends


@pytest.mark.parametrize("cut", ["reset", "silent"])
async def test_a_follower_whose_stream_is_cut_converges_by_polling(
    tmp_path: Path, cut: str
) -> None:
    upstream = make_node(tmp_path, "upstream", f"sqlite:///{tmp_path}/cp.db", [])
    proxy = StreamCuttingProxy(upstream.url, cut)
    proxy_port = free_port()
    # listen stays on (the default): the follower does try the upstream's stream.
    follower = make_node(tmp_path, "follower", f"http://127.0.0.1:{proxy_port}",
                         [upstream.verify_key])
    await acli("db", "migrate", "--config", str(upstream.config))
    await acli("publish", "--config", str(upstream.config), str(EXAMPLE))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, proxy.handle, proxy_port,
                                        host="127.0.0.1"))
            async with run_daemon(upstream.config) as up:
                await up.wait_log("published", revision=1)
                async with run_daemon(follower.config) as daemon:
                    await wait_active(follower, 1)
                    if cut == "reset":
                        await daemon.wait_log("upstream stream unreachable")
                    else:
                        await daemon.wait_log("following the upstream's stream for wake-ups")
                    for revision in (2, 3):
                        await acli("publish", "--config", str(upstream.config), str(EXAMPLE))
                        await daemon.wait_log("published", revision=revision)
                    await wait_active(follower, 3)
                    assert proxy.upgrades >= 1 and proxy.forwarded >= 3
            nursery.cancel_scope.cancel()
