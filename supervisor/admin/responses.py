"""Answers of the admin API as ASGI messages: JSON bodies, errors, headers, refusals.

Every error body is JSON ``{"error": "<code>", "detail": "<text>"}`` (:func:`error_response`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from wsgiref.handlers import format_date_time

from supervisor.admin.stream import Scope, Send, encode_json

__all__ = ["JSON", "Response", "entity_tags", "error_response", "etag_matches", "header_value",
           "http_date", "json_response", "raw_response", "refusal",
           "scope_headers", "send_response"]

JSON = b"application/json"


@dataclass
class Response:
    """One answer; ``cache`` is its ``Cache-Control``, ``no-store`` unless the route says."""

    status: int
    body: bytes = b""
    content_type: bytes | None = JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    cache: bytes = b"no-store"


def json_response(status: int, doc: Any, headers: Iterable[tuple[bytes, bytes]] = ()) -> Response:
    return Response(status, encode_json(doc), JSON, list(headers))


def error_response(
    status: int, error: str, detail: str, headers: Iterable[tuple[bytes, bytes]] = ()
) -> Response:
    return json_response(status, {"error": error, "detail": detail}, headers)


_ETAG = re.compile(r'(?:W/)?"[^"]*"')


def entity_tags(if_none_match: str) -> list[str]:
    """The entity tags an ``If-None-Match`` lists, quotes kept, ``W/`` dropped (weak
    comparison): the one reading of the header every match uses."""
    return [tag.removeprefix("W/") for tag in _ETAG.findall(if_none_match)]


def etag_matches(if_none_match: str, etag: str) -> bool:
    """``If-None-Match`` against our ETag, with the weak comparison RFC 9110 asks for."""
    if if_none_match.strip() == "*":
        return True
    return etag.removeprefix("W/") in entity_tags(if_none_match)


def header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """All values of one header joined with ", " (RFC 9110 list syntax), or None."""
    values = [v for k, v in headers if k.lower() == name]
    if not values:
        return None
    return b", ".join(values).decode("latin-1")


def scope_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The scope's headers; anything but a pair of bytes is dropped rather than trusted
    (the app must not crash on what a client sent)."""
    return [(item[0], item[1]) for item in scope.get("headers") or []
            if isinstance(item, list | tuple) and len(item) == 2
            and isinstance(item[0], bytes) and isinstance(item[1], bytes)]


def refusal(status: int, error: str, detail: str, *headers: tuple[bytes, bytes]) -> Response:
    """An error answer (401, 403, 421) that ends its connection (``Connection: close``).

    A client without the token, or a browser page, gets one small answer, no keep-alive.
    So it cannot pipeline thousands of requests and read the answers slowly.
    That would keep a connection busy, its writes blocked, past every idle deadline.
    """
    return error_response(status, error, detail, [*headers, (b"connection", b"close")])


def response_headers(response: Response, length: int | None) -> list[tuple[bytes, bytes]]:
    headers = list(response.headers)
    if response.content_type is not None:
        headers.append((b"content-type", response.content_type))
    if length is not None:
        headers.append((b"content-length", str(length).encode("ascii")))
    headers.append((b"cache-control", response.cache))
    return headers


def http_date() -> bytes:
    """Now, as an HTTP ``Date`` header value."""
    return format_date_time(time.time()).encode("ascii")


def raw_response(response: Response, *, head: bool) -> bytes:
    """``response`` as the bytes of an HTTP/1.1 answer that closes its connection
    (as the connection would write it: same headers, ``date``, ``connection: close``)."""
    lines = [f"HTTP/1.1 {response.status} ".encode("ascii")]
    headers = response_headers(response, len(response.body))
    headers += [(b"date", http_date()), (b"connection", b"close")]
    lines += [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + (b"" if head else response.body)


async def send_response(send: Send, response: Response, *, head: bool = False,
                        kind: str = "http") -> None:
    """Send ``response`` as ASGI ``<kind>.response.start`` and ``.body`` messages
    (``kind`` ``websocket.http``: a WebSocket handshake refused before its accept)."""
    not_modified = response.status == 304
    length = None if not_modified else len(response.body)
    await send({"type": f"{kind}.response.start", "status": response.status,
                "headers": response_headers(response, length)})
    body = b"" if head or not_modified else response.body
    await send({"type": f"{kind}.response.body", "body": body, "more_body": False})

