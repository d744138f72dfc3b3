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
This module therefore runs the accept loop itself
(:mod:`supervisor.admin.accept`), hands each connection to hypercorn's own
per-connection ``TCPServer`` restricted to HTTP/1.1
(:mod:`supervisor.admin.http11`), and keeps each connection's stream so it can
reset one: the stream hub resets a stream client stuck in a write (see
:mod:`supervisor.admin.stream`), and shutdown resets the rest. The hypercorn
names used (``TCPServer``, ``WorkerContext``, ``wrap_app``, ``Config``) are pinned by the
``hypercorn<0.19`` requirement and exercised by the integration tests (written
against 0.18). As a kernel-level backstop the listening socket carries
``TCP_USER_TIMEOUT`` (30 s, Linux), which accepted sockets inherit: a peer that
leaves our data unacknowledged that long is dropped by the kernel.

hypercorn's own loggers: the access log is off (a scrape every few seconds is
noise); the error log is the stdlib ``hypercorn.error`` logger, which
:func:`supervisor.logs.configure` routes through the daemon's renderer at WARNING.

Connection discipline (why: a flood of connections must not take the
descriptors the rest of the daemon needs, nor ``/healthz``):

- HTTP/1.1 only: the HTTP/2 preface closes the connection at once;
- a complete request head within ``IDLE_DEADLINE_S`` of accepting (and of the
  previous response on a keep-alive connection), or the connection is closed;
  an answer whose writes make no progress for as long is reset
  (:mod:`supervisor.admin.http11`), and a refusal (401, 403, 421) ends its
  connection: pipelining requests and leaving the answers unread keeps no
  connection busy;
- at most ``max_connections`` held (:mod:`supervisor.admin.limits`: the soft
  ``RLIMIT_NOFILE``, first raised to the hard limit, minus a reserve), and at
  most ``max_stream_clients`` of them stream clients (derived from the same
  limit; a configured stream ``max_clients`` that does not fit is lowered, with
  a warning naming both numbers). At the limit the longest-idle connection
  makes room, or the new one is refused (:mod:`supervisor.admin.connections`);
- a ``/healthz`` probe whose request (``Connection: close``) is already waiting
  when it is accepted is answered by the accept loop itself, taking no slot and
  no handler task (:meth:`AdminApp.answer_at_once`): its latency does not grow
  with the number of connections being served.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import wrap_app

from supervisor.admin.accept import AcceptLoop
from supervisor.admin.app import AdminApp
from supervisor.admin.auth import read_token
from supervisor.admin.connections import ConnectionTable, Peer, reset
from supervisor.admin.context import AdminContext
from supervisor.admin.errors import AdminBindError
from supervisor.admin.hosts import AllowedHosts
from supervisor.admin.http11 import Http11Connection, first_request_head
from supervisor.admin.limits import ConnectionLimits, current_nofile, derive, raise_nofile
from supervisor.admin.stream import RawSend, StreamHub, StreamSettings
from supervisor.config import split_host_port
from supervisor.errors import ConfigError
from supervisor.logs import get_logger
from supervisor.telemetry import Metrics

__all__ = ["bind_listener", "read_token", "serve_admin"]

log = get_logger("admin")

# The kernel caps it at net.core.somaxconn. Deep, because the accept loop drains
# it quickly (in batches) and a connection dropped from a full backlog costs its
# client a SYN retransmission (a second or more) rather than a wait in line.
BACKLOG = 4096
# Kernel-level backstop for a peer that stops reading: data unacknowledged (or
# stuck behind a zero window) this long aborts the connection. Linux only;
# accepted sockets inherit it from the listening socket.
TCP_USER_TIMEOUT_MS = 30_000
# A connection must send a complete request head within this long of being
# accepted, or of its previous response (hypercorn's keep_alive_timeout).
IDLE_DEADLINE_S = 5.0
# Slots for /healthz alone when every other one is busy, and how long a
# connection there has to send its request (a probe sends it at once).
RESERVED_SLOTS = 16
RESERVE_DEADLINE_S = 1.0
HEALTHZ = (b"GET /healthz ", b"HEAD /healthz ")


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
    # A connection must deliver a complete request head within this long of
    # being accepted (and of its previous response): hypercorn's idle timer.
    config.keep_alive_timeout = IDLE_DEADLINE_S
    # Clients have nothing to say on the stream: a small limit bounds what one
    # can make us buffer.
    config.websocket_max_message_size = 64 * 1024
    return config


class _Server:
    """hypercorn's per-connection protocol on our accept loop; see the module docstring."""

    def __init__(self, sock: socket.socket, limits: ConnectionLimits, metrics: Metrics) -> None:
        self.config = _hypercorn_config()
        self._app: Any = None
        self._answer_at_once: Callable[[bytes], bytes | None] | None = None
        self._sock = sock
        self._context = WorkerContext(None)
        self._table = ConnectionTable(
            limits.max_connections,
            RESERVED_SLOTS,
            metrics,
            reserve_admits=lambda head: head.startswith(HEALTHZ),
        )
        # Shielded: cancelling serve_admin must not cancel the connections
        # before they are closed in order (stream clients first, with 1001).
        self._scope = trio.CancelScope(shield=True)
        self._accepting = trio.CancelScope()
        # Past their first request head: the stream hub writes frames through them.
        self._connections: dict[Peer, Http11Connection] = {}
        self._done = trio.Event()

    def mount(self, app: AdminApp) -> None:
        asgi: Any = app  # hypercorn's ASGI type is narrower than our Scope mappings
        self._app = wrap_app(asgi, self.config.wsgi_max_body_size, "asgi")
        self._answer_at_once = app.answer_at_once

    @property
    def connection_count(self) -> int:
        return len(self._table)

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
        def spawn(peer: Peer, stream: trio.SocketStream, pool: str) -> None:
            handlers.start_soon(self._handle, peer, stream, pool)

        accept = AcceptLoop(self._sock, self._table, spawn, self._answer_at_once)
        try:
            with self._accepting:
                await handlers.start(accept.run)
                task_status.started()
                await trio.sleep_forever()
        finally:
            # Not accepting any more: close the socket now, so a client that
            # connects during the rest of shutdown is refused at once instead of
            # waiting in the kernel's backlog.
            accept.close()

    async def _handle(self, key: Peer, stream: trio.SocketStream, pool: str) -> None:
        connection: Http11Connection | None = None
        try:
            # Until its first request head is complete a connection costs only
            # this task: an idle flood never reaches hypercorn.
            reserve = pool == ConnectionTable.RESERVE
            deadline = RESERVE_DEADLINE_S if reserve else IDLE_DEADLINE_S
            if not await first_request_head(stream, deadline, only=HEALTHZ if reserve else None):
                reset(stream)
                return
            connection = Http11Connection(
                self._app,
                self.config,
                self._context,
                stream,
                lambda idle: self._table.set_idle(key, stream, idle),
            )
            self._connections[key] = connection
            await connection
        except Exception:  # one connection's failure must not stop the server
            log.exception("admin connection failed", peer=f"{key[0]}:{key[1]}")
        finally:
            if connection is not None and self._connections.get(key) is connection:
                del self._connections[key]
            self._table.remove(key, stream)
            stream.socket.close()

    def reset(self, peer: tuple[str, int]) -> bool:
        """Reset the connection from ``peer`` (ASGI ``scope["client"]``); False if none."""
        stream = self._table.get(peer)
        if stream is None:
            return False
        reset(stream)
        return True

    def raw_sender(self, peer: tuple[str, int]) -> RawSend | None:
        """The raw frame writer of the connection from ``peer`` (None if none)."""
        connection = self._connections.get(peer)
        return None if connection is None else connection.send_raw

    async def stop(self, hub: StreamHub, timeout_s: float) -> None:
        """Graceful part of shutdown; the caller bounds it and then calls :meth:`kill`."""
        self._accepting.cancel()
        await hub.close_all(timeout_s / 2)
        # Idle keep-alive connections close now; busy ones after their response.
        await self._context.terminated.set()
        await self._done.wait()

    def kill(self) -> None:
        for stream in self._table.streams():
            reset(stream)
        self._scope.cancel()


def connection_limits(settings: StreamSettings, nofile: int | None) -> ConnectionLimits:
    """The limits for this process, logged; a warning when they lower the configured ones."""
    limits = derive(nofile, settings.max_clients)
    if limits.stream_clients_lowered:
        log.warning(
            "admin stream max_clients exceeds what RLIMIT_NOFILE allows; lowered",
            max_clients=limits.configured_stream_clients,
            allowed=limits.max_stream_clients,
            nofile=limits.nofile,
            reserve=limits.reserve,
            max_connections=limits.max_connections,
        )
    return limits


async def serve_admin(
    ctx: AdminContext,
    listen: str,
    *,
    settings: StreamSettings | None = None,
    shutdown_timeout_s: float = 2.0,
    limits: ConnectionLimits | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin API on ``listen`` until cancelled; see the module docstring."""
    sock = bind_listener(listen)
    try:
        bound = sock.getsockname()
        host, port = str(bound[0]), int(bound[1])
        settings = settings or StreamSettings()
        if limits is None:
            raised = raise_nofile()
            if raised is not None:
                log.info("raised the soft RLIMIT_NOFILE to the hard limit",
                         before=raised[0], after=raised[1])
            limits = connection_limits(settings, current_nofile())
        settings = replace(settings, max_clients=limits.max_stream_clients)
        server = _Server(sock, limits, ctx.metrics)
        hub = StreamHub(
            ctx.events,
            ctx.status,
            ctx.metrics,
            settings,
            abort=server.reset,
            raw_sender=server.raw_sender,
        )
        hosts = AllowedHosts(split_host_port(listen)[0], ctx.allowed_hosts, port=port,
                             origins=ctx.allowed_origins)
        server.mount(AdminApp(ctx, hub, hosts))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            nursery.start_soon(hub.monitor)
            log.info(
                "admin API listening",
                address=f"{host}:{port}",
                auth=ctx.token is not None,
                max_connections=limits.max_connections,
                max_stream_clients=limits.max_stream_clients,
                nofile=limits.nofile,
            )
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
