"""The admin API as an ASGI application (docs/admin-api.md).

The routes and what each answers: ``docs/admin-api.md`` (generated from this
module's route table and :mod:`supervisor.docs_catalog`). The plumbing of
answers (status, headers, refusing a WebSocket handshake) is :mod:`.responses`.

``HEAD`` is answered like ``GET`` without the body. Any other method gets 405
with ``Allow``; an unknown path gets 404. Every error body is JSON
``{"error": "<code>", "detail": "<text>"}``; dynamic answers carry
``Cache-Control: no-store`` (the snapshot ``no-cache``: revalidate by ETag).

Host and Origin (:mod:`.hosts`): every route but ``/healthz`` answers 421 to a
``Host`` the server is not known by, and a WebSocket handshake or a ``POST`` with
a foreign ``Origin`` is refused with 403; both are checked before the token.

Authentication: when :attr:`AdminContext.token` is set, every route except
``/healthz`` needs ``Authorization: Bearer <token>`` (:mod:`.auth`); otherwise
HTTP answers 401 with ``WWW-Authenticate: Bearer realm="trio-supervisor"``, and a
WebSocket handshake is refused before it is accepted, also with 401 (through
ASGI's ``websocket.http.response`` extension, which hypercorn implements; a
server without it sends 403). Authentication is checked before routing, so
without the token nothing reveals which paths exist.

Robustness: a handler that raises answers 500 JSON and is logged; the app never
lets a request's failure reach the server. It reads state only and never awaits
anything but the transport (and ``/v1/revision``'s one file read in a worker
thread), so a slow reader cannot hold up the daemon. The one
exception, ``POST /v1/converge``, awaits the loop's answer, but the loop never
awaits it: a client that disconnects (or a deadline that passes) only stops this
request waiting, and the loop answers the abandoned request into the void.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.exposition import choose_encoder

from supervisor.admin.auth import authorized
from supervisor.admin.context import AdminContext
from supervisor.admin.hosts import AllowedHosts
from supervisor.admin.responses import (
    JSON,
    Response,
    error_response,
    etag_matches,
    forbidden_origin,
    header_value,
    json_response,
    misdirected,
    raw_response,
    reject_handshake,
    scope_headers,
    send_response,
    unauthorized,
)
from supervisor.admin.signed import Unservable
from supervisor.admin.stream import Receive, Scope, Send, StreamHub
from supervisor.logs import get_logger

__all__ = ["AdminApp", "Response", "etag_matches"]

log = get_logger("admin")

ALLOW = b"GET, HEAD"
STREAM_PATH = "/v1/stream"
REVISION_PATH = "/v1/revision"
SIGNED = b"application/vnd.trio-supervisor.lkg"
OPEN_PATHS = frozenset({"/healthz"})
CONVERGE_PATH = "/v1/converge"
CONVERGE_TIMEOUT_S = 60.0
CONVERGE_TIMEOUT_MAX_S = 300.0


class AdminApp:
    """The ASGI callable. ``hub`` serves ``/v1/stream`` (None: the stream answers 503)."""

    def __init__(
        self, ctx: AdminContext, hub: StreamHub | None = None, hosts: AllowedHosts | None = None
    ) -> None:
        self.ctx = ctx
        self.hub = hub
        # None: no Host/Origin check (an app mounted without a listener, in tests).
        self.hosts = hosts
        # The last snapshot served and its body. Snapshots are immutable, so the
        # body is encoded once per snapshot (identity), not once per request: a
        # large one costs milliseconds of event loop to encode.
        self._body_of: tuple[object, bytes] | None = None
        self._routes: dict[str, Callable[[list[tuple[bytes, bytes]]], Response]] = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/status": self._status,
            "/metrics": self._metrics,
            "/v1/snapshot": self._snapshot,
            REVISION_PATH: self._revision,
            STREAM_PATH: self._stream_over_http,
            CONVERGE_PATH: self._converge_not_posted,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)

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
                response = self._refuse_post(headers)
                if response is None:
                    response = await self._converge(scope, receive)
                    if response is None:
                        return  # the client is gone: nobody to answer
            else:
                response = self._respond(method, path, headers)
                if response is _READ_SIGNED:
                    response = await self._revision_from_file()
        except Exception:  # one request's failure must never reach the server
            log.exception("admin request failed", path=str(path)[:200])
            response = error_response(500, "internal", "internal error; see the daemon's log")
        await send_response(send, response, head=method == "HEAD")

    def _respond(self, method: Any, path: Any, headers: list[tuple[bytes, bytes]]) -> Response:
        if not isinstance(path, str) or not isinstance(method, str):
            return error_response(400, "bad_request", "malformed request")
        if path not in OPEN_PATHS and not self._known_host(headers):
            return misdirected()
        if path not in OPEN_PATHS and not self._authorized(headers):
            return unauthorized(headers)
        handler = self._routes.get(path)
        if handler is None:
            return error_response(404, "not_found", "no such route")
        if method not in ("GET", "HEAD"):
            return error_response(
                405, "method_not_allowed", f"{path} answers GET and HEAD", [(b"allow", ALLOW)]
            )
        return handler(headers)

    def _refuse_post(self, headers: list[tuple[bytes, bytes]]) -> Response | None:
        """Why a POST may not run (421, 403, 401, in that order); None when it may."""
        if not self._known_host(headers):
            return misdirected()
        if not self._allowed_origin(headers):
            return forbidden_origin()
        if not self._authorized(headers):
            return unauthorized(headers)
        return None

    def answer_at_once(self, head: bytes) -> bytes | None:
        """The whole answer to a request whose complete head is ``head``, when the
        accept loop may send it without a connection slot: a ``GET`` or ``HEAD``
        of ``/healthz`` asking to close the connection (as probes do) with no
        body and nothing unusual; None for anything else (served as usual)."""
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[1] != b"/healthz" or parts[0] not in (b"GET", b"HEAD"):
            return None
        if parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            return None
        close = False
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(b":")
            name = name.lower()
            if not sep or not name or name != name.strip() or name in _NOT_AT_ONCE:
                return None  # malformed, a body, or an upgrade: hypercorn decides
            if name == b"connection":
                close = close or b"close" in value.lower().replace(b" ", b"").split(b",")
        if not close:
            return None
        return raw_response(self._healthz([]), head=parts[0] == b"HEAD")

    def _known_host(self, headers: list[tuple[bytes, bytes]]) -> bool:
        return self.hosts is None or self.hosts.allows_host_header(header_value(headers, b"host"))

    def _allowed_origin(self, headers: list[tuple[bytes, bytes]]) -> bool:
        return self.hosts is None or self.hosts.allows_origin(header_value(headers, b"origin"))

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        token = self.ctx.token
        return token is None or authorized(headers, token)

    def _healthz(self, headers: list[tuple[bytes, bytes]]) -> Response:
        # Answering at all proves the event loop runs: nothing here can block.
        unhealthy = self.ctx.unhealthy()
        if unhealthy:
            return json_response(503, {"ok": False, "unhealthy": unhealthy})
        return json_response(200, {"ok": True})

    def _readyz(self, headers: list[tuple[bytes, bytes]]) -> Response:
        snapshot = self.ctx.state.snapshot
        if snapshot is not None:
            return json_response(
                200,
                {"ready": True, "revision": snapshot.revision, "generation": snapshot.generation},
            )
        rev = self.ctx.revision
        reason = "no snapshot published yet"
        if rev.last_error:
            reason = f"{reason}; last attempt failed: {rev.last_error}"
        return json_response(
            503,
            {"ready": False, "reason": reason, "consecutive_failures": rev.consecutive_failures},
        )

    def _status(self, headers: list[tuple[bytes, bytes]]) -> Response:
        return json_response(200, self.ctx.status())

    def _metrics(self, headers: list[tuple[bytes, bytes]]) -> Response:
        accept = header_value(headers, b"accept") or ""
        try:
            encoder, content_type = choose_encoder(accept)
        except (ValueError, TypeError, IndexError, AttributeError):
            # A malformed version or escaping parameter: fall back to plain text
            # rather than failing a scrape over a header.
            encoder, content_type = generate_latest, CONTENT_TYPE_LATEST
        body = encoder(self.ctx.metrics.registry)
        return Response(200, body, content_type.encode("latin-1"))

    def _snapshot(self, headers: list[tuple[bytes, bytes]]) -> Response:
        snapshot = self.ctx.state.snapshot
        if snapshot is None:
            return error_response(503, "no_snapshot", "no snapshot published yet")
        etag = snapshot.etag()
        tag_header = [(b"etag", etag.encode("latin-1"))]
        if_none_match = header_value(headers, b"if-none-match")
        if if_none_match is not None and etag_matches(if_none_match, etag):
            return Response(304, b"", None, tag_header, cache=b"no-cache")
        cached = self._body_of
        if cached is not None and cached[0] is snapshot:
            body = cached[1]
        else:
            body = snapshot.to_json()
            self._body_of = (snapshot, body)
        return Response(200, body, JSON, tag_header, cache=b"no-cache")

    def _converge_not_posted(self, headers: list[tuple[bytes, bytes]]) -> Response:
        return error_response(
            405, "method_not_allowed", f"{CONVERGE_PATH} answers POST", [(b"allow", b"POST")]
        )

    async def _converge(self, scope: Scope, receive: Receive) -> Response | None:
        """Run an attempt now and answer its outcome; None when the client went away."""
        converge = self.ctx.converge
        if converge is None:
            return error_response(503, "unavailable", "this process runs no convergence loop")
        timeout_s = _timeout_param(scope.get("query_string"))
        if timeout_s is None:
            return error_response(
                400, "bad_request",
                f"timeout_s must be a number above 0 and at most {CONVERGE_TIMEOUT_MAX_S:g}",
            )
        gone = False
        answer = None
        async with trio.open_nursery() as nursery:

            async def until_disconnect() -> None:
                nonlocal gone
                while True:
                    message = await receive()
                    # A server's receive blocks once the body is in; a checkpoint
                    # anyway, so one that does not cannot starve the event loop.
                    await trio.lowlevel.checkpoint()
                    if message.get("type") == "http.disconnect":
                        gone = True
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(until_disconnect)
            answer = await converge(timeout_s)
            nursery.cancel_scope.cancel()
        if gone:
            log.debug("converge request abandoned by its client", peer=str(scope.get("client")))
            return None
        if answer is None:
            return error_response(
                504, "timeout", f"no convergence attempt finished within {timeout_s:g} s"
            )
        return json_response(200, answer.to_json())

    def _revision(self, headers: list[tuple[bytes, bytes]]) -> Response:
        signed = self.ctx.signed
        snapshot = self.ctx.state.snapshot
        if signed is None or signed.unservable_reason() is not None:
            detail = signed.unservable_reason() if signed is not None else None
            return error_response(503, "no_signing_key", detail or "no signed revisions here")
        if snapshot is None:
            return error_response(503, "no_snapshot", "no revision is active yet")
        etag = f'"{snapshot.revision}"'
        tag_header = [(b"etag", etag.encode("latin-1"))]
        if_none_match = header_value(headers, b"if-none-match")
        if if_none_match is not None and etag_matches(if_none_match, etag):
            return Response(304, b"", None, tag_header, cache=b"no-cache")
        data = signed.held(snapshot.revision, self.ctx.state.body_sha256)
        if data is None:
            return _READ_SIGNED
        return Response(200, data, SIGNED, tag_header, cache=b"no-cache")

    async def _revision_from_file(self) -> Response:
        signed = self.ctx.signed
        snapshot = self.ctx.state.snapshot
        assert signed is not None and snapshot is not None  # _revision checked both
        revision, digest = snapshot.revision, self.ctx.state.body_sha256
        try:
            data = await trio.to_thread.run_sync(signed.read, revision, digest)
        except Unservable as exc:
            return error_response(503, "not_exported", str(exc), [(b"retry-after", b"1")])
        return Response(200, data, SIGNED, [(b"etag", f'"{revision}"'.encode("latin-1"))],
                        cache=b"no-cache")

    def _stream_over_http(self, headers: list[tuple[bytes, bytes]]) -> Response:
        return error_response(
            426, "upgrade_required", "this route is a WebSocket", [(b"upgrade", b"websocket")]
        )

    # -- WebSocket -----------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        if message.get("type") != "websocket.connect":
            return
        headers = scope_headers(scope)
        hub = self.hub
        if not self._known_host(headers):
            await reject_handshake(scope, send, misdirected())
        elif not self._allowed_origin(headers):
            await reject_handshake(scope, send, forbidden_origin())
        elif scope.get("path") != STREAM_PATH:
            # Same order as HTTP: without the token, nothing reveals which paths exist.
            if not self._authorized(headers):
                await reject_handshake(scope, send, unauthorized(headers))
            else:
                await reject_handshake(
                    scope, send, error_response(404, "not_found", "no such route"))
        elif not self._authorized(headers):
            await reject_handshake(scope, send, unauthorized(headers))
        elif hub is None or hub.closing:
            await reject_handshake(scope, send, error_response(503, "unavailable", "shutting down"))
        elif hub.full():
            await reject_handshake(
                scope, send, error_response(503, "too_many_clients", "too many stream clients")
            )
        else:
            try:
                await hub.serve(scope, receive, send)
            except Exception:  # one client's failure must not reach the server
                log.exception("stream client failed", peer=str(scope.get("client")))


def _timeout_param(query: Any) -> float | None:
    """``timeout_s`` of a query string (the default when absent); None when invalid."""
    if not isinstance(query, bytes) or not query:
        return CONVERGE_TIMEOUT_S
    values = parse_qs(query.decode("latin-1")).get("timeout_s")
    if not values:
        return CONVERGE_TIMEOUT_S
    try:
        value = float(values[-1])
    except ValueError:
        return None
    if not 0 < value <= CONVERGE_TIMEOUT_MAX_S:  # also refuses nan
        return None
    return value


# Headers that keep a request from being answered by the accept loop.
_NOT_AT_ONCE = frozenset({b"content-length", b"transfer-encoding", b"upgrade", b"expect"})

# _revision's answer when the bytes must first be read from the disk (in _http).
_READ_SIGNED = Response(0)


async def _lifespan(receive: Receive, send: Send) -> None:
    # Nothing to set up or tear down: serve_admin owns the resources. Answering
    # keeps any ASGI server that runs a lifespan from logging a warning.
    while True:
        message = await receive()
        kind = message.get("type")
        if kind == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif kind == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
        else:
            return
