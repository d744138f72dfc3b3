"""The admin API as an ASGI application: :class:`AdminApp` sends each request to its handler.

The handlers are :mod:`.routes`; the plumbing of answers is :mod:`.responses`.
Operators: docs/admin-api.md, generated from this app's route table and :mod:`tools.docs_catalog`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from supervisor.admin.auth import WWW_AUTHENTICATE, authorized
from supervisor.admin.context import AdminContext
from supervisor.admin.hosts import AllowedHosts
from supervisor.admin.responses import (
    Response,
    error_response,
    header_value,
    raw_response,
    refusal,
    scope_headers,
    send_response,
)
from supervisor.admin.routes import CONVERGE_PATH, READ_SIGNED, STREAM_PATH, Routes
from supervisor.admin.stream import Receive, Scope, Send, StreamHub
from supervisor.logs import get_logger

__all__ = ["AdminApp"]

log = get_logger("admin")

ALLOW = b"GET, HEAD"
OPEN_PATHS = frozenset({"/healthz"})


class AdminApp:
    """The ASGI callable. ``hub`` serves ``/v1/stream`` (None: the stream answers 503).

    The checks run in order: Host and Origin (:mod:`.hosts`), then the token (:mod:`.auth`).
    All come before routing, so without the token nothing reveals which paths exist.
    A WebSocket handshake is refused (401) before it is accepted, with the real status.
    ``HEAD`` answers like ``GET`` without the body.
    Dynamic answers carry ``Cache-Control: no-store``; the snapshot ``no-cache`` (ETag).

    A handler that raises answers 500 JSON and is logged; no failure reaches the server.
    It reads state only, and awaits only the transport and ``/v1/revision``'s file read.
    So a slow reader cannot hold up the daemon.
    ``POST /v1/converge`` awaits the loop's answer, but the loop never awaits it.
    A client gone (or a deadline past) only stops its request waiting.
    """

    def __init__(self, ctx: AdminContext, hub: StreamHub | None = None,
                 hosts: AllowedHosts | None = None) -> None:
        self.ctx = ctx
        self.hub = hub
        # None: no Host/Origin check (an app mounted without a listener, in tests).
        self.hosts = hosts
        self._handlers = Routes(ctx)
        self._routes = self._handlers.table()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)

    # -- HTTP ----------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method")
        path = scope.get("path")
        headers = scope_headers(scope)
        response: Response | None
        try:
            if method == "POST" and path == CONVERGE_PATH:
                # The one route that acts: held to every check the others get,
                # and to Origin, since a cross-site page can send a simple POST
                # without any CORS preflight.
                response = self._refusal(headers, origin=True, write=True)
                if response is None:
                    response = await self._handlers.converge(scope, receive)
                    if response is None:
                        return  # the client is gone: nobody to answer
            else:
                response = self._respond(method, path, headers)
                if response is READ_SIGNED:
                    response = await self._handlers.revision_from_file()
        except Exception:  # one request's failure must never reach the server
            log.exception("admin request failed", path=str(path)[:200])
            response = error_response(500, "internal", "internal error; see the daemon's log")
        await send_response(send, response, head=method == "HEAD")

    def _respond(self, method: Any, path: Any, headers: list[tuple[bytes, bytes]]) -> Response:
        if not isinstance(path, str) or not isinstance(method, str):
            return error_response(400, "bad_request", "malformed request")
        refusal = None if path in OPEN_PATHS else self._refusal(headers, origin=False)
        if refusal is not None:
            return refusal
        handler = self._routes.get(path)
        if handler is None:
            return error_response(404, "not_found", "no such route")
        if method not in ("GET", "HEAD"):
            return error_response(405, "method_not_allowed", f"{path} answers GET and HEAD",
                                  [(b"allow", ALLOW)])
        return handler(headers)

    def _refusal(self, headers: list[tuple[bytes, bytes]], *, origin: bool,
                 write: bool = False) -> Response | None:
        """Why a request may not proceed; None when it may. In this order:

        an unknown Host (421); a foreign Origin (403, checked when ``origin``);
        no token (401); a read token where ``write`` asks for the full one (403).
        """
        hosts = self.hosts
        if hosts is not None and not hosts.allows_host_header(header_value(headers, b"host")):
            return refusal(421, "misdirected_request", "unknown Host; see [admin].allowed_hosts")
        if origin and hosts is not None and not hosts.allows_origin(
                header_value(headers, b"origin")):
            return refusal(403, "forbidden_origin", "Origin not allowed")
        if self._authorized(headers, write=write):
            return None
        if write and self._authorized(headers):
            return refusal(403, "read_only",
                           "this token may read but not act; POST needs [admin].token_file's")
        presented = any(k.lower() == b"authorization" for k, _ in headers)
        challenge = WWW_AUTHENTICATE + (b', error="invalid_token"' if presented else b"")
        return refusal(401, "unauthorized", "missing or invalid bearer token",
                       (b"www-authenticate", challenge))

    def answer_at_once(self, head: bytes) -> bytes | None:
        """The whole answer to a request whose complete head is ``head``, sent without a slot.

        Only a ``GET`` or ``HEAD`` of ``/healthz`` asking to close the connection, as probes do.
        It has no body and nothing unusual. None for anything else (served as usual).
        """
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[1] != b"/healthz" or parts[0] not in (b"GET", b"HEAD"):
            return None
        if parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            return None
        close, hosts = False, 0
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(b":")
            name = name.lower()
            if not sep or not name or name != name.strip() or name in _NOT_AT_ONCE:
                return None  # malformed, a body, or an upgrade: the connection decides
            hosts += name == b"host"
            if name == b"connection":
                close = close or b"close" in value.lower().replace(b" ", b"").split(b",")
        # HTTP/1.1 needs one Host, HTTP/1.0 at most one: else the connection's 400.
        if not close or hosts > 1 or (hosts == 0 and parts[2] == b"HTTP/1.1"):
            return None
        return raw_response(self._handlers.healthz([]), head=parts[0] == b"HEAD")

    def _authorized(self, headers: list[tuple[bytes, bytes]], *, write: bool = False) -> bool:
        """The full token, or (``write`` False: the routes that only read) the read token."""
        token = self.ctx.token
        if token is None or authorized(headers, token):
            return True
        read = self.ctx.read_token
        return not write and read is not None and authorized(headers, read)

    # -- WebSocket -----------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        if message.get("type") != "websocket.connect":
            return
        hub = self.hub
        # Same order as HTTP: without the token, nothing reveals which paths exist.
        refusal = self._refusal(scope_headers(scope), origin=True)
        if refusal is None and scope.get("path") != STREAM_PATH:
            refusal = error_response(404, "not_found", "no such route")
        if refusal is None and (hub is None or hub.closing):
            refusal = error_response(503, "unavailable", "shutting down")
        if refusal is None and hub is not None and hub.full():
            refusal = error_response(503, "too_many_clients", "too many stream clients")
        if refusal is not None:
            # Through ASGI's websocket.http.response extension, which the admin server has.
            await send_response(send, refusal, kind="websocket.http")
            return
        assert hub is not None  # refused above when there is none
        self._handlers.followers.note(scope_headers(scope))
        try:
            await hub.serve(scope, receive, send,
                            allowed=partial(self._authorized, scope_headers(scope)))
        except Exception:  # one client's failure must not reach the server
            log.exception("stream client failed", peer=str(scope.get("client")))


# Headers that keep a request from being answered by the accept loop.
_NOT_AT_ONCE = frozenset({b"content-length", b"transfer-encoding", b"upgrade", b"expect"})
