"""Serving the admin API: HTTP/1.1 and WebSocket, with or without TLS, under trio.

:func:`serve_admin` binds and serves; :class:`_Server` owns the connections and their shutdown.
Operators: docs/operations.md, "Security" (the connection discipline) and "The stream at scale".
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from typing import Any

import trio

from supervisor.admin.accept import AcceptLoop
from supervisor.admin.app import AdminApp
from supervisor.admin.connections import ConnectionTable, Peer, has_pending, reset
from supervisor.admin.context import AdminContext
from supervisor.admin.errors import AdminBindError
from supervisor.admin.hosts import AllowedHosts
from supervisor.admin.http11 import App, Http11Connection, first_request_head
from supervisor.admin.limits import ConnectionLimits, current_nofile, derive, raise_nofile
from supervisor.admin.stream import RawSend, StreamHub, StreamSettings
from supervisor.config import split_host_port
from supervisor.errors import ConfigError
from supervisor.logs import get_logger
from supervisor.telemetry import Metrics

__all__ = ["bind_listener", "serve_admin"]

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
# accepted, or of its previous response.
IDLE_DEADLINE_S = 5.0
# Slots for /healthz alone when every other one is busy, and how long a
# connection there has to send its request (a probe sends it at once).
RESERVED_SLOTS = 16
RESERVE_DEADLINE_S = 1.0
HEALTHZ = (b"GET /healthz ", b"HEAD /healthz ")
HEALTHZ_PATHS = frozenset({b"/healthz"})
# How long, and how much, a closing connection's unread input is drained (see _close).
LINGER_S = 0.2
LINGER_BYTES = 256 * 1024
TLS_HANDSHAKE = b"\x16"  # the record type a TLS ClientHello arrives in


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


_BIND_FAILURES = {errno.EADDRINUSE: "already in use",
                  errno.EADDRNOTAVAIL: "is not an address of this host",
                  errno.EACCES: "cannot be bound: permission denied"}


def _bind_failure(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot be resolved ({exc.strerror or exc})"
    return _BIND_FAILURES.get(exc.errno or 0, f"cannot be bound: {exc.strerror or exc}")


class _Server:
    """Our accept loop and HTTP/1.1 connections, over ``h11`` and ``wsproto``.

    Both libraries do no I/O, so every socket operation, deadline and reset is here.
    Why not an ASGI server (hypercorn's ``serve``): it writes inside an unbounded shield.
    One peer that stops reading then blocks its task and shutdown forever.
    It also negotiates HTTP/2 (which restarts no idle timer) whenever a client asks.
    It negotiates ``permessage-deflate``, which inflates a frame before any size limit.
    It accepts one connection per scheduler pass, and cannot reset one connection.
    Nor can it write a shared frame to one.

    The discipline, so a flood takes neither the daemon's descriptors nor ``/healthz``:

    - HTTP/1.1 only: the HTTP/2 preface closes the connection at once.
    - A complete request head within ``IDLE_DEADLINE_S`` of accepting or of the last answer.
      An answer whose writes stall as long is reset (:mod:`supervisor.admin.http11`).
    - A refusal (401, 403, 421) ends its connection: unread pipelined answers hold nothing.
    - At most ``max_connections`` held, ``max_stream_clients`` of them streams
      (:mod:`supervisor.admin.limits`). At the limit the longest-idle one makes room,
      or the new one is refused (:mod:`supervisor.admin.connections`).
    - A ``/healthz`` probe already waiting at accept is answered by the accept loop.
      It takes no slot and no task (:meth:`AdminApp.answer_at_once`).
    - Under TLS the accept loop cannot read a head: the connection serves the probe,
      from the reserve pool when the main one is full.

    The stream hub resets a client stuck in a write; :meth:`kill` resets the rest.
    The kernel backstop: the listening socket's ``TCP_USER_TIMEOUT`` (30 s, Linux), inherited.
    """

    def __init__(self, sock: socket.socket, limits: ConnectionLimits, metrics: Metrics,
                 tls: Callable[[], ssl.SSLContext] | None = None) -> None:
        self._app: App | None = None
        self._answer_at_once: Callable[[bytes], bytes | None] | None = None
        self._sock = sock
        self._tls = tls
        # Under TLS the head is encrypted: a handshake may take a reserve slot,
        # and the connection then serves /healthz alone (as a plain one does).
        self._table = ConnectionTable(
            limits.max_connections, RESERVED_SLOTS, metrics,
            reserve_admits=(lambda head: head.startswith(HEALTHZ)) if tls is None
            else (lambda head: head[:1] == TLS_HANDSHAKE))
        # Shielded: cancelling serve_admin must not cancel the connections
        # before they are closed in order (stream clients first, with 1001).
        self._scope = trio.CancelScope(shield=True)
        self._accepting = trio.CancelScope()
        self._connections: dict[Peer, Http11Connection] = {}
        self._closing = False
        self._done = trio.Event()

    def mount(self, app: AdminApp) -> None:
        self._app = app
        # Under TLS the accept loop cannot read a request head: no answer at once.
        self._answer_at_once = app.answer_at_once if self._tls is None else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as handlers:

                    def spawn(peer: Peer, stream: trio.SocketStream, pool: str) -> None:
                        handlers.start_soon(self._handle, peer, stream, pool)

                    accept = AcceptLoop(self._sock, self._table, spawn, self._answer_at_once)
                    task_status.started()
                    try:
                        with self._accepting:
                            await accept.run()
                    finally:
                        # Not accepting any more: close the socket now, so a client that
                        # connects during the rest of shutdown is refused at once instead
                        # of waiting in the kernel's backlog.
                        accept.close()
        finally:
            self._done.set()

    async def _handle(self, key: Peer, stream: trio.SocketStream, pool: str) -> None:
        reserve = pool == ConnectionTable.RESERVE
        assert self._app is not None
        connection = Http11Connection(
            self._app, stream, client=key,
            on_idle=lambda idle: self._table.set_idle(key, stream, idle),
            idle_s=IDLE_DEADLINE_S, only_paths=HEALTHZ_PATHS if reserve else None)
        self._connections[key] = connection
        if self._closing:
            connection.close_if_idle()

        async def opening() -> trio.abc.Stream | None:
            if self._tls is not None:
                return await self._handshake(key, stream)
            # Until its first request head is complete a plain connection
            # costs only this task: an idle flood never reaches a parser.
            only = HEALTHZ if reserve else None
            return stream if await first_request_head(stream, only=only) else None

        try:
            deadline = trio.current_time() + (RESERVE_DEADLINE_S if reserve else IDLE_DEADLINE_S)
            await connection.run(deadline, opening)
        except* Exception:
            # One connection's failure must not stop the server, also when it comes
            # grouped with the Cancelled of a stop (which goes on unswallowed).
            log.exception("admin connection failed", peer=f"{key[0]}:{key[1]}")
        finally:
            if self._connections.get(key) is connection:
                del self._connections[key]
            self._table.remove(key, stream)
            await self._close(stream)

    async def _handshake(self, key: Peer, stream: trio.SocketStream) -> trio.SSLStream[Any] | None:
        """The TLS handshake (the context of this moment: a reload applies to new
        handshakes); None when it fails (logged at debug: scanners are common)."""
        assert self._tls is not None
        tls = trio.SSLStream(stream, self._tls(), server_side=True, https_compatible=True)
        try:
            await tls.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            cause = exc.__cause__ or exc
            log.debug("admin TLS handshake failed", peer=f"{key[0]}:{key[1]}", error=str(cause))
            return None
        return tls

    @staticmethod
    async def _close(stream: trio.SocketStream) -> None:
        """End the connection with a FIN; a closed (reset) socket stays closed.

        Closing a socket with unread bytes sends a reset: the client may lose our last answer.
        (A 413 before the whole body was read.) So those bytes are first drained,
        briefly and boundedly (``LINGER_S``, ``LINGER_BYTES``).
        """
        sock = stream.socket
        if sock.fileno() == -1:
            return
        with suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
            if not has_pending(sock):
                sock.close()
                return
            with trio.move_on_after(LINGER_S):
                drained = 0
                while drained < LINGER_BYTES:
                    data = await sock.recv(65536)
                    if not data:
                        break
                    drained += len(data)
        sock.close()

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
        # Idle connections close now; busy ones after their answer.
        self._closing = True
        for connection in self._connections.values():
            connection.close_if_idle()
        await self._done.wait()

    def kill(self) -> None:
        for stream in self._table.streams():
            reset(stream)
        self._scope.cancel()


def connection_limits(settings: StreamSettings, nofile: int | None) -> ConnectionLimits:
    """The limits for this process, logged; a warning when they lower the configured ones."""
    limits = derive(nofile, settings.max_clients)
    if limits.stream_clients_lowered:
        log.warning("admin stream max_clients exceeds what RLIMIT_NOFILE allows; lowered",
                    max_clients=limits.configured_stream_clients, allowed=limits.max_stream_clients,
                    nofile=limits.nofile, reserve=limits.reserve,
                    max_connections=limits.max_connections)
    return limits


async def serve_admin(
    ctx: AdminContext,
    listen: str,
    *,
    settings: StreamSettings | None = None,
    shutdown_timeout_s: float = 2.0,
    limits: ConnectionLimits | None = None,
    tls: Callable[[], ssl.SSLContext] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin API on ``listen`` until cancelled; ``nursery.start`` shape.

    It binds ``listen`` itself, before reporting started. A port in use, an address
    not of this host or a privileged port raise :class:`AdminBindError`.
    That is a :class:`~supervisor.errors.StartError` naming ``$.admin.listen`` and the address.
    The tree does not restart it and the CLI exits 1: a process restart may succeed.
    A malformed value stays a :class:`~supervisor.errors.ConfigError` (exit 2).
    ``task_status.started((host, port))`` reports the bound address: ``"127.0.0.1:0"`` works.

    ``tls``: the server context in force at each handshake (None: plain HTTP).
    Each handshake must complete within the head deadline; a reload applies to new ones.

    Cancellation runs shutdown, shielded and within ``shutdown_timeout_s``, even against
    a peer that stopped reading. It stops accepting and closes stream clients with 1001.
    Idle keep-alive connections close, busy ones finish their answer; the rest are reset.
    """
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
        server = _Server(sock, limits, ctx.metrics, tls)
        hub = StreamHub(ctx.events, ctx.status, ctx.metrics, settings, abort=server.reset,
                        raw_sender=server.raw_sender)
        ctx.tokens_changed.append(hub.revoke)
        hosts = AllowedHosts(split_host_port(listen)[0], ctx.allowed_hosts, port=port,
                             scheme="http" if tls is None else "https", origins=ctx.allowed_origins)
        server.mount(AdminApp(ctx, hub, hosts))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            nursery.start_soon(hub.monitor)
            log.info("admin API listening", address=f"{host}:{port}", auth=ctx.token is not None,
                     tls=tls is not None, max_connections=limits.max_connections,
                     max_stream_clients=limits.max_stream_clients, nofile=limits.nofile)
            task_status.started((host, port))
            try:
                await trio.sleep_forever()
            finally:
                ctx.tokens_changed.remove(hub.revoke)
                with trio.move_on_after(shutdown_timeout_s, shield=True):
                    await server.stop(hub, shutdown_timeout_s)
                server.kill()
                nursery.cancel_scope.cancel()
    finally:
        sock.close()
