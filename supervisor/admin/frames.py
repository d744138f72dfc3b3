"""WebSocket frames built once and written as they are (the stream's shared frames).

A server's frames are unmasked (RFC 6455, section 5.1), so one event's frame is
the same bytes for every client: :class:`Encoded` holds a message's text (for
ASGI ``websocket.send``) and its complete frame (for a :data:`RawSend`, the
admin server's per-connection raw write, see :mod:`supervisor.admin.http11`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ["ConnectionGone", "Encoded", "RawSend", "text_frame"]

# Writes bytes that are already a complete WebSocket frame; ConnectionGone when
# the connection is gone.
RawSend = Callable[[bytes], Awaitable[None]]


class ConnectionGone(Exception):
    """A raw write found the connection closed or reset (RawSend's only failure)."""


def text_frame(payload: bytes) -> bytes:
    """``payload`` (UTF-8) as one final, unmasked WebSocket text frame (RFC 6455,
    section 5.2): what a server sends, identical for every client."""
    n = len(payload)
    if n < 126:
        header = bytes((0x81, n))
    elif n < 1 << 16:
        header = bytes((0x81, 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((0x81, 127)) + n.to_bytes(8, "big")
    return header + payload


class Encoded:
    """One message, encoded once: its text (for ASGI) and its frame (for raw writes)."""

    __slots__ = ("frame", "text")

    def __init__(self, payload: bytes) -> None:
        self.text = payload.decode()
        self.frame = text_frame(payload)
