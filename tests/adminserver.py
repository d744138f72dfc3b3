"""Helpers shared by the admin API's tests.

A fresh :class:`AdminContext`, a real server on a free loopback port, and
WebSocket clients that read or never read. The stand-in snapshot is
:class:`tests.fakes.snapshot.FakeSnapshot`.
"""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

from supervisor.admin.app import AdminApp
from supervisor.admin.context import AdminContext
from supervisor.admin.server import serve_admin
from supervisor.convergence.status import RevisionStatus
from supervisor.errors import find_leaf
from supervisor.events import EventBus, Published, Rejected
from supervisor.fanout.status import FanoutStatus
from supervisor.sinks.state import ActiveState
from supervisor.status_doc import ChildReport
from supervisor.telemetry import Metrics

CHILDREN = {"convergence": ChildReport(state="running", restarts=0, last_error=None)}


def make_ctx(
    token: str | None = None, children: Callable[[], dict[str, ChildReport]] | None = None
) -> AdminContext:
    state = ActiveState()
    return AdminContext(
        state=state,
        revision=RevisionStatus(state),
        events=EventBus(),
        metrics=Metrics(process=False),
        children=children or (lambda: dict(CHILDREN)),
        fanout={"ServiceDefinition": FanoutStatus("watching", None, 12)},
        token=token,
    )


def published(revision: int, generation: int = 1) -> Published:
    """A ``published`` event of ``revision``, for a test to push through the stream."""
    return Published(revision=revision, generation=generation, source="control_plane",
                     took_s=0.0)


def rejected(revision: int, reason: str = "projection", detail: str = "") -> Rejected:
    """A ``rejected`` event of ``revision``; a long ``detail`` makes it as large as a test needs."""
    return Rejected(revision=revision, reason=reason, detail=detail, active=None)


@dataclass
class Running:
    host: str
    port: int
    stop: Callable[[], None]

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/stream"


@asynccontextmanager
async def running_admin(
    ctx: AdminContext, listen: str = "127.0.0.1:0", **kwargs: Any
) -> AsyncIterator[Running]:
    """serve_admin under nursery.start; ``stop()`` cancels it (as the tree would)."""
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run(*, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
            with scope:
                await serve_admin(ctx, listen, task_status=task_status, **kwargs)

        host, port = await nursery.start(run)
        yield Running(host, port, scope.cancel)
        scope.cancel()


def counter_value(counter: Any) -> float:
    return float(counter._value.get())


async def raw_stream_client(host: str, port: int, *, rcvbuf: int = 4096) -> trio.socket.SocketType:
    """A WebSocket client that completes the handshake and then never reads:
    a small receive buffer makes the server's writes block soon."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /v1/stream HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await sock.send(request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await sock.recv(1)
        assert chunk, "server closed during the handshake"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


@asynccontextmanager
async def owned_ws(
    host: str, port: int, headers: list[tuple[bytes, bytes]] | None = None
) -> AsyncIterator[WebSocketConnection]:
    """A trio-websocket client on a TCP stream the test owns and closes.

    For tests where the server closes first or refuses the handshake:
    ``open_websocket_url`` leaves its socket open then (trio-websocket 0.12),
    which ``-W error`` turns into a failure. A refusal surfaces as the bare
    ``ConnectionRejected``, not wrapped in an exception group.
    """
    stream = await trio.open_tcp_stream(host, port)
    try:
        try:
            async with trio.open_nursery() as nursery:
                ws = await wrap_client_stream(
                    nursery, stream, f"{host}:{port}", "/v1/stream", extra_headers=headers
                )
                try:
                    yield ws
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            leaf = find_leaf(group, Exception)
            if leaf is None:
                raise
            raise leaf from None
    finally:
        await trio.aclose_forcefully(stream)


async def call(
    app: AdminApp,
    method: str,
    path: Any,
    headers: list[tuple[bytes, bytes]] | None = None,
    **scope_extra: Any,
) -> tuple[int, dict[bytes, bytes], bytes]:
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path,
                             "headers": headers or [], **scope_extra}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with trio.fail_after(5):
        await app(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    return sent[0]["status"], dict(sent[0]["headers"]), sent[1]["body"]
