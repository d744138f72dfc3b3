"""What each admin route answers, from the state the loops report (docs/admin-api.md).

:class:`Routes` holds the handlers; :meth:`Routes.table` maps each path to one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.exposition import choose_encoder

from supervisor.admin.context import AdminContext
from supervisor.admin.fleet import Followers
from supervisor.admin.responses import (
    JSON,
    Response,
    error_response,
    header_value,
    json_response,
)
from supervisor.admin.signed import Unservable, etag_for, not_modified
from supervisor.admin.stream import Receive, Scope, until_disconnect
from supervisor.controlplane.replica_name import REVISION_PATH
from supervisor.logs import get_logger
from supervisor.threads import FILE_IO_DEADLINE_S, ThreadDeadline, in_thread

__all__ = ["CONVERGE_PATH", "CONVERGE_TIMEOUT_MAX_S", "CONVERGE_TIMEOUT_S", "FOLLOWERS_PATH",
           "READ_SIGNED", "REVISION_PATH", "SIGNED", "STREAM_PATH", "Handler", "Routes"]

log = get_logger("admin")

STREAM_PATH = "/v1/stream"
SIGNED = b"application/vnd.trio-supervisor.lkg"
CONVERGE_PATH = "/v1/converge"
FOLLOWERS_PATH = "/v1/followers"
CONVERGE_TIMEOUT_S = 60.0
CONVERGE_TIMEOUT_MAX_S = 300.0

Handler = Callable[[list[tuple[bytes, bytes]]], Response]

# revision's answer when the bytes must first be read from the disk (the caller
# then awaits revision_from_file).
READ_SIGNED = Response(0)


class Routes:
    """The handlers of the admin API's paths, over ``ctx``.

    A handler takes the request's headers and returns its Response at once.
    It reads state only and awaits nothing, so ``/healthz`` answering proves the loop runs.
    Two routes may await; :class:`~supervisor.admin.app.AdminApp` awaits them itself.
    ``GET /v1/revision`` answers :data:`READ_SIGNED` when the signed bytes are not in memory;
    then :meth:`revision_from_file` reads them. ``POST /v1/converge`` is :meth:`converge`.
    Which requests reach a handler (method, Host, Origin, token) the caller decides first.
    """

    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx
        # The last snapshot served and its body. Snapshots are immutable, so the
        # body is encoded once per snapshot (identity), not once per request: a
        # large one costs milliseconds of event loop to encode.
        self._body_of: tuple[object, bytes] | None = None
        #: The direct followers, as their fetches and streams name them.
        self.followers = Followers()
        ctx.metrics.track_followers(self.followers.count)

    def table(self) -> dict[str, Handler]:
        """Each path and its handler, in the order docs/admin-api.md lists them."""
        return {
            "/healthz": self.healthz,
            "/readyz": self.readyz,
            "/status": self.status,
            "/metrics": self.metrics,
            "/v1/snapshot": self.snapshot,
            REVISION_PATH: self.revision,
            FOLLOWERS_PATH: self.followers_seen,
            STREAM_PATH: self.stream_over_http,
            CONVERGE_PATH: self.converge_not_posted,
        }

    def healthz(self, headers: list[tuple[bytes, bytes]]) -> Response:
        # Answering at all proves the event loop runs: nothing here can block.
        unhealthy = self.ctx.unhealthy()
        if unhealthy:
            return json_response(503, {"ok": False, "unhealthy": unhealthy})
        return json_response(200, {"ok": True})

    def readyz(self, headers: list[tuple[bytes, bytes]]) -> Response:
        snapshot = self.ctx.state.snapshot
        if snapshot is not None:
            return json_response(
                200,
                {"ready": True, "revision": snapshot.revision, "generation": snapshot.generation})
        rev = self.ctx.revision
        reason = "no snapshot published yet"
        if rev.last_error:
            reason = f"{reason}; last attempt failed: {rev.last_error}"
        return json_response(
            503,
            {"ready": False, "reason": reason, "consecutive_failures": rev.consecutive_failures})

    def status(self, headers: list[tuple[bytes, bytes]]) -> Response:
        return json_response(200, self.ctx.status())

    def metrics(self, headers: list[tuple[bytes, bytes]]) -> Response:
        accept = header_value(headers, b"accept") or ""
        try:
            encoder, content_type = choose_encoder(accept)
        except (ValueError, TypeError, IndexError, AttributeError):
            # A malformed version or escaping parameter: fall back to plain text
            # rather than failing a scrape over a header.
            encoder, content_type = generate_latest, CONTENT_TYPE_LATEST
        body = encoder(self.ctx.metrics.registry)
        return Response(200, body, content_type.encode("latin-1"))

    def snapshot(self, headers: list[tuple[bytes, bytes]]) -> Response:
        snapshot = self.ctx.state.snapshot
        if snapshot is None:
            return error_response(503, "no_snapshot", "no snapshot published yet")
        etag = snapshot.etag()
        if not_modified(header_value(headers, b"if-none-match"), etag, None):
            return _tagged(304, b"", None, etag)
        cached = self._body_of
        if cached is not None and cached[0] is snapshot:
            body = cached[1]
        else:
            body = snapshot.to_json()
            self._body_of = (snapshot, body)
        return _tagged(200, body, JSON, etag)

    def converge_not_posted(self, headers: list[tuple[bytes, bytes]]) -> Response:
        return error_response(405, "method_not_allowed", f"{CONVERGE_PATH} answers POST",
                              [(b"allow", b"POST")])

    async def converge(self, scope: Scope, receive: Receive) -> Response | None:
        """Run an attempt now and answer its outcome; None when the client went away.

        It waits at most ``timeout_s``: the query parameter, default ``CONVERGE_TIMEOUT_S``,
        at most ``CONVERGE_TIMEOUT_MAX_S``. The loop never awaits it.
        So a client that disconnects only stops this request waiting.
        """
        converge = self.ctx.converge
        if converge is None:
            return error_response(503, "unavailable", "this process runs no convergence loop")
        timeout_s = _timeout_param(scope.get("query_string"))
        if timeout_s is None:
            return error_response(
                400, "bad_request",
                f"timeout_s must be a number above 0 and at most {CONVERGE_TIMEOUT_MAX_S:g}")
        answer = None
        with trio.CancelScope() as request:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_disconnect, receive, request)
                answer = await converge(timeout_s)
                nursery.cancel_scope.cancel()
        if request.cancelled_caught:
            log.debug("converge request abandoned by its client", peer=str(scope.get("client")))
            return None
        if answer is None:
            return error_response(504, "timeout",
                                  f"no convergence attempt finished within {timeout_s:g} s")
        return json_response(200, answer)

    def followers_seen(self, headers: list[tuple[bytes, bytes]]) -> Response:
        return json_response(200, self.followers.answer())

    def revision(self, headers: list[tuple[bytes, bytes]]) -> Response:
        self.followers.note(headers)
        signed, snapshot = self.ctx.signed, self.ctx.state.snapshot
        if signed is None or signed.unservable_reason() is not None:
            detail = signed.unservable_reason() if signed is not None else None
            return error_response(503, "no_signing_key", detail or "no signed revisions here")
        if snapshot is None:
            return error_response(503, "no_snapshot", "no revision is active yet")
        state = self.ctx.state
        # Sequence, digest and issued_at: a reused id or a fresh statement is never a 304.
        etag = etag_for(snapshot.revision, state.body_sha256, state.statement)
        if not_modified(header_value(headers, b"if-none-match"), etag, state.statement):
            return _tagged(304, b"", None, etag)
        data = signed.held(etag)
        return READ_SIGNED if data is None else _tagged(200, data, SIGNED, etag)

    async def revision_from_file(self) -> Response:
        """``GET /v1/revision`` from the cache file, read in a worker thread."""
        signed, snapshot = self.ctx.signed, self.ctx.state.snapshot
        assert signed is not None and snapshot is not None  # revision checked both
        state = self.ctx.state
        revision, digest, statement = snapshot.revision, state.body_sha256, state.statement
        try:
            data = await in_thread(partial(signed.read, revision, digest, statement),
                                   dependency="files", deadline_s=FILE_IO_DEADLINE_S,
                                   what="the signed revision read")
        except (Unservable, ThreadDeadline) as exc:
            return error_response(503, "not_exported", str(exc), [(b"retry-after", b"1")])
        return _tagged(200, data, SIGNED, etag_for(revision, digest, statement))

    def stream_over_http(self, headers: list[tuple[bytes, bytes]]) -> Response:
        return error_response(426, "upgrade_required", "this route is a WebSocket",
                              [(b"upgrade", b"websocket")])


def _tagged(status: int, body: bytes, content_type: bytes | None, etag: str) -> Response:
    """An answer carrying its ETag, to revalidate (``no-cache``)."""
    return Response(status, body, content_type, [(b"etag", etag.encode("latin-1"))],
                    cache=b"no-cache")


def _timeout_param(query: Any) -> float | None:
    """``timeout_s`` of a query string (the default when absent); None when invalid."""
    text = query.decode("latin-1") if isinstance(query, bytes) else ""
    values = parse_qs(text).get("timeout_s")
    if not values:
        return CONVERGE_TIMEOUT_S
    try:
        value = float(values[-1])
    except ValueError:
        return None
    if not 0 < value <= CONVERGE_TIMEOUT_MAX_S:  # also refuses nan
        return None
    return value
