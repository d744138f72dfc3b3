"""The pieces of the tests' one-request HTTP proxies in front of an upstream replica.

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
