"""The pieces of the tests' one-request HTTP proxies in front of an upstream replica.

:class:`SwitchingProxy` sends each request to one of several upstreams.
A proxy reads one request head (:func:`read_head`), forwards a GET with the
headers the follower protocol uses (:func:`forward_get`), and answers with a
body and the upstream's ETag, closing the connection (:func:`answer`); what it
does in between (flip a byte, cut a WebSocket upgrade) is the test's fault.
"""

from __future__ import annotations

import httpx
import trio

FORWARDED = ("if-none-match", "authorization")


async def read_head(stream: trio.SocketStream) -> tuple[str, dict[str, str]] | None:
    """(request line, headers by lower-case name), or None when the client went away."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        data += chunk
    request_line, *header_lines = data.split(b"\r\n\r\n")[0].decode().split("\r\n")
    headers = {k.strip().lower(): v.strip()
               for k, v in (line.split(":", 1) for line in header_lines)}
    return request_line, headers


async def forward_get(upstream: str, request_line: str,
                      headers: dict[str, str]) -> httpx.Response:
    """The request's GET against ``upstream``, with the follower's conditional and token."""
    forwarded = {k: v for k, v in headers.items() if k in FORWARDED}
    async with httpx.AsyncClient() as http:
        return await http.get(upstream + request_line.split(" ")[1], headers=forwarded)


async def answer(stream: trio.SocketStream, response: httpx.Response, body: bytes) -> None:
    """``body`` with the upstream's status and ETag; then the connection closes."""
    head = (f"HTTP/1.1 {response.status_code} X\r\ncontent-length: {len(body)}\r\n"
            f"etag: {response.headers.get('etag', '')}\r\nconnection: close\r\n\r\n")
    await stream.send_all(head.encode() + body)
    await stream.aclose()


class SwitchingProxy:
    """``GET`` forwarded to one of ``upstreams``: ``index`` chooses it, or ``round_robin``
    alternates at every request; what each request got is counted in ``answers``."""

    def __init__(self, *upstreams: str) -> None:
        self.upstreams = list(upstreams)
        self.index = 0
        self.round_robin = False
        self.port = 0
        self.answers: dict[int, int] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            head = await read_head(stream)
            if head is None:
                return
            upstream = self.upstreams[self.index]
            if self.round_robin:
                self.index = (self.index + 1) % len(self.upstreams)
            response = await forward_get(upstream, head[0], head[1])
            self.answers[response.status_code] = self.answers.get(response.status_code, 0) + 1
            await answer(stream, response, response.content)
        except (trio.BrokenResourceError, trio.ClosedResourceError, httpx.HTTPError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)
