"""Serving the admin API: hypercorn's HTTP/1.1 and WebSocket protocol under trio.

:func:`serve_admin` has ``nursery.start`` shape. It binds ``listen`` itself,
*before* reporting started, so:

- a port in use (or an address not of this host, or a privileged port) raises
  :class:`AdminBindError`, a :class:`~supervisor.errors.StartError` naming
  ``$.admin.listen`` and the address: the tree does not restart it and the CLI
  exits 1 (a restart of the process may succeed; a malformed value stays a
  :class:`~supervisor.errors.ConfigError`, exit 2);
- ``task_status.started((host, port))`` reports the bound address, so
  ``"127.0.0.1:0"`` picks a free port and the caller learns which.

Shutdown (cancellation) runs, shielded and within ``shutdown_timeout_s``:
stop accepting; close every stream client with 1001 "going away"; let idle
keep-alive connections close and busy ones finish their response; then reset
whatever is left (a peer that stopped reading) and stop. The deadline holds even
against such a peer.

Why not ``hypercorn.trio.serve``: hypercorn writes to a socket inside an
unbounded cancellation shield, so one peer that stops reading (a paused
``watch``, a frozen scraper) would block that connection's task forever and with
it the server's shutdown, and nothing outside can reach the socket to undo it.
This module therefore runs the accept loop itself, hands each connection to
hypercorn's own per-connection ``TCPServer`` (the same class ``serve`` uses),
and keeps each connection's stream so it can reset one: the stream hub resets a
stream client stuck in a write (see :mod:`supervisor.admin.stream`), and
shutdown resets the rest. The hypercorn names used (``TCPServer``,
``WorkerContext``, ``wrap_app``, ``Config``) are pinned by the
``hypercorn<0.19`` requirement and exercised by the integration tests (written
against 0.18). As a kernel-level backstop the listening socket carries
``TCP_USER_TIMEOUT`` (30 s, Linux), which accepted sockets inherit: a peer that
leaves our data unacknowledged that long is dropped by the kernel.

hypercorn's own loggers: the access log is off (a scrape every few seconds is
noise); the error log is the stdlib ``hypercorn.error`` logger, which
:func:`supervisor.logs.configure` routes through the daemon's renderer at WARNING.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from supervisor.admin.app import AdminApp
from supervisor.admin.auth import read_token
from supervisor.admin.context import AdminContext
from supervisor.admin.errors import AdminBindError
from supervisor.admin.stream import StreamHub, StreamSettings
from supervisor.config import split_host_port
from supervisor.errors import ConfigError
from supervisor.logs import get_logger

__all__ = ["bind_listener", "read_token", "serve_admin"]

log = get_logger("admin")

BACKLOG = 128
# Kernel-level backstop for a peer that stops reading: data unacknowledged (or
# stuck behind a zero window) this long aborts the connection. Linux only;
# accepted sockets inherit it from the listening socket.
TCP_USER_TIMEOUT_MS = 30_000


def bind_listener(listen: str) -> socket.socket:
    """A listening TCP socket on ``listen`` ("HOST:PORT", "[v6]:PORT"); AdminBindError if not."""
    try:
        host, port = split_host_port(listen)
    except ValueError as exc:
        raise ConfigError("$.admin.listen", str(exc)) from exc
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Rebinding right after a restart must not wait out TIME_WAIT; on Linux
        # this never allows two live listeners on one port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
        if user_timeout is not None:
            sock.setsockopt(socket.IPPROTO_TCP, user_timeout, TCP_USER_TIMEOUT_MS)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise AdminBindError(listen, _bind_failure(exc)) from exc
    return sock


def _bind_failure(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot be resolved ({exc.strerror or exc})"
    if exc.errno == errno.EADDRINUSE:
        return "already in use"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "is not an address of this host"
    if exc.errno == errno.EACCES:
        return "cannot be bound: permission denied"
    return f"cannot be bound: {exc.strerror or exc}"


def _hypercorn_config() -> HypercornConfig:
    config = HypercornConfig()
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.include_server_header = False
    # Clients have nothing to say on the stream: a small limit bounds what one
    # can make us buffer.
    config.websocket_max_message_size = 64 * 1024
    return config


def _reset(stream: trio.SocketStream) -> None:
    """Abort a connection with a RST: buffered unsent data is dropped, and a task
    blocked writing to it wakes (trio's close notifies waiters)."""
    sock = stream.socket
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass  # already closed or not a TCP socket: closing is all that is left
    sock.close()


class _Server:
    """hypercorn's per-connection protocol on our accept loop; see the module docstring."""

    def __init__(self, sock: socket.socket) -> None:
        self.config = _hypercorn_config()
        self._app: Any = None
        self._listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        self._context = WorkerContext(None)
        self._conns: dict[tuple[str, int], trio.SocketStream] = {}
        # Shielded: cancelling serve_admin must not cancel the connections
        # before they are closed in order (stream clients first, with 1001).
        self._scope = trio.CancelScope(shield=True)
        self._accepting = trio.CancelScope()
        self._done = trio.Event()

    def mount(self, app: Any) -> None:
        self._app = wrap_app(app, self.config.wsgi_max_body_size, "asgi")

    @property
    def connection_count(self) -> int:
        return len(self._conns)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as handlers:
                    await handlers.start(self._accept, handlers)
                    task_status.started()
        finally:
            self._done.set()

    async def _accept(
        self,
        handlers: trio.Nursery,
        *,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with self._accepting:
                await trio.serve_listeners(
                    self._handle,
                    [self._listener],
                    handler_nursery=handlers,
                    task_status=task_status,
                )
        finally:
            # Not accepting any more: close the socket now, so a client that
            # connects during the rest of shutdown is refused at once instead of
            # waiting in the kernel's backlog.
            self._listener.socket.close()

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            peer = stream.socket.getpeername()
        except OSError:
            return  # gone before we looked
        key = (str(peer[0]), int(peer[1]))
        self._conns[key] = stream
        try:
            # hypercorn annotates an SSLStream, but TCPServer handles a plain
            # SocketStream too (worker_serve passes exactly that for http://).
            await TCPServer(
                self._app,
                self.config,
                self._context,
                ConnectionState({}),
                stream,  # type: ignore[arg-type]
            )
        except Exception:  # one connection's failure must not stop the server
            log.exception("admin connection failed", peer=f"{key[0]}:{key[1]}")
        finally:
            if self._conns.get(key) is stream:
                del self._conns[key]

    def reset(self, peer: tuple[str, int]) -> bool:
        """Reset the connection from ``peer`` (ASGI ``scope["client"]``); False if none."""
        stream = self._conns.get(peer)
        if stream is None:
            return False
        _reset(stream)
        return True

    async def stop(self, hub: StreamHub, timeout_s: float) -> None:
        """Graceful part of shutdown; the caller bounds it and then calls :meth:`kill`."""
        self._accepting.cancel()
        await hub.close_all(timeout_s / 2)
        # Idle keep-alive connections close now; busy ones after their response.
        await self._context.terminated.set()
        await self._done.wait()

    def kill(self) -> None:
        for stream in list(self._conns.values()):
            _reset(stream)
        self._scope.cancel()


async def serve_admin(
    ctx: AdminContext,
    listen: str,
    *,
    settings: StreamSettings | None = None,
    shutdown_timeout_s: float = 2.0,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin API on ``listen`` until cancelled; see the module docstring."""
    sock = bind_listener(listen)
    try:
        bound = sock.getsockname()
        host, port = str(bound[0]), int(bound[1])
        server = _Server(sock)
        hub = StreamHub(ctx.events, ctx.status, ctx.metrics, settings, abort=server.reset)
        server.mount(AdminApp(ctx, hub))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            nursery.start_soon(hub.monitor)
            log.info("admin API listening", address=f"{host}:{port}", auth=ctx.token is not None)
            task_status.started((host, port))
            try:
                await trio.sleep_forever()
            finally:
                with trio.move_on_after(shutdown_timeout_s, shield=True):
                    await server.stop(hub, shutdown_timeout_s)
                server.kill()
                nursery.cancel_scope.cancel()
    finally:
        sock.close()
