"""The client side of the admin API: what ``trio-supervisor status`` and ``watch`` call.

:func:`fetch_status` gets ``/status``; :func:`watch_stream` follows ``/v1/stream``;
:func:`~supervisor.admin.status_view.render_status` renders a document.
Every failure names its innermost cause (:func:`~supervisor.errors.describe_failure`).
A refused certificate reads ``TLS: CERTIFICATE_VERIFY_FAILED: <why>``, with where its CA
is given (``--ca-file``).
"""

from __future__ import annotations

import json
import random
import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import httpx
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    wrap_client_stream,
)

from supervisor.admin.errors import AdminRefused, AdminUnreachable
from supervisor.backoff import Backoff
from supervisor.bounds import DETAIL_BYTES, cut
from supervisor.errors import describe_failure, find_leaf
from supervisor.logs import get_logger
from supervisor.texttable import printable

__all__ = [
    "auth_headers",
    "ca_file_context",
    "close_politely",
    "converge_url",
    "fetch_status",
    "replica_websocket",
    "stream_url",
    "watch_stream",
]

log = get_logger("admin.client")

CLEAN_CLOSE = (1000, 1001)
# Without a heartbeat_s in the first message (an older server), consider the
# connection lost after this long without any message.
DEFAULT_IDLE_TIMEOUT_S = 60.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: The largest ``/status`` body read (a replica's is a few KiB, a large fan-out's well
#: under a MiB).
MAX_STATUS_BYTES = 16 * 1024 * 1024


# -- URLs -------------------------------------------------------------------------

#: Path endings that name a replica's endpoint, not the replica: dropped from its base.
_ENDPOINTS = ("/v1/stream", "/v1/converge")


def _url(base_url: str) -> httpx.URL:
    """``base_url`` parsed (``h:p`` is ``http://h:p``; schemes in lower case, RFC 3986
    3.1); AdminUnreachable naming it when it is not a URL with a valid port."""
    text = base_url.strip()
    try:
        url = httpx.URL(text if "://" in text else f"http://{text}")
    except httpx.InvalidURL as exc:
        raise AdminUnreachable(base_url, f"not a URL ({exc})") from exc
    if url.port is not None and not 0 < url.port < 65536:
        raise AdminUnreachable(base_url, f"port {url.port} is not between 1 and 65535")
    return url


def _status_url(base_url: str) -> str:
    url = _url(base_url)
    path = url.path.rstrip("/")
    return str(url.copy_with(path=path if path.endswith("/status") else f"{path}/status"))


def _replica(url: httpx.URL, scheme: dict[str, str], endpoint: str) -> str:
    """A replica's address, its scheme mapped by ``scheme`` (else kept), at ``endpoint``.

    A path prefix is kept; a ``/v1/stream`` or ``/v1/converge`` dropped: both name the replica.
    """
    path = url.path.rstrip("/")
    for ending in _ENDPOINTS:
        path = path.removesuffix(ending)
    return str(url.copy_with(scheme=scheme.get(url.scheme, url.scheme), path=path + endpoint))


def stream_url(base_url: str) -> str:
    """``http://h:p`` (or ``h:p``) -> ``ws://h:p/v1/stream``.

    A ws URL with a path passes through; one naming only the replica
    (``ws://h:p``) gets ``/v1/stream``, as :func:`converge_url` reads it.
    """
    url = _url(base_url)
    if url.scheme in ("ws", "wss") and url.path != "/":
        return str(url)
    return _replica(url, {"http": "ws", "https": "wss"}, "/v1/stream")


def converge_url(base_url: str) -> str:
    """Any form of a replica's address -> ``http(s)://h:p/v1/converge``.

    ``publish --wait`` takes replicas as stream URLs too (``ws://h:p/v1/stream``);
    its converge request must reach the same replica over HTTP.
    """
    return _replica(_url(base_url), {"ws": "http", "wss": "https"}, "/v1/converge")


def auth_headers(token: str | None) -> dict[str, str]:
    """The admin token as an HTTP request's header (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def _detail(response: httpx.Response, body: bytes) -> str:
    """What an error answer says, in half a detail (whatever answers on the port wrote it;
    it is quoted inside one)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return cut(response.reason_phrase or "", DETAIL_BYTES // 2)
    if isinstance(doc, dict):
        return cut(str(doc.get("detail") or doc.get("reason") or doc.get("error") or ""),
                   DETAIL_BYTES // 2)
    return ""


#: After a refused certificate: where the CLI is told the replica's CA.
CA_HINT = "the replica's CA: --ca-file"


# -- status ------------------------------------------------------------------------


def ca_file_context(ca_file: str | None) -> ssl.SSLContext | None:
    """``--ca-file``: the context an https/wss replica is verified with (None: the
    system's trust store); UsageError naming the option when the file is unusable."""
    if ca_file is None:
        return None
    from supervisor.errors import ConfigError, UsageError
    from supervisor.tlsconfig import client_context

    try:
        return client_context(ca_file, where="--ca-file")
    except ConfigError as exc:
        raise UsageError(f"--ca-file: {exc.reason}") from exc


async def _bounded_body(response: httpx.Response, url: str) -> bytes:
    """The body, read no further than :data:`MAX_STATUS_BYTES`: whatever answers on the
    port (not necessarily a replica) cannot make this process hold more."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_STATUS_BYTES:
            raise AdminUnreachable(
                url, f"answered with a body of more than {MAX_STATUS_BYTES // 2**20} MiB")
        chunks.append(chunk)
    return b"".join(chunks)


async def fetch_status(
    base_url: str, token: str | None = None, *, timeout_s: float = 5.0,
    ssl_context: ssl.SSLContext | None = None, client: httpx.AsyncClient | None = None,
) -> dict[str, Any]:
    """GET ``<base_url>/status`` and return the document.

    Any failure raises :class:`AdminUnreachable`: connect, timeout, non-200, an
    undecodable body, a body over ``MAX_STATUS_BYTES``. A 401/403 raises its subclass
    :class:`AdminRefused`. The environment's proxy settings are ignored.
    The admin API is a direct endpoint; a proxy meant for the internet only gets in the way.
    ``ssl_context``: what an https replica is verified with (None: the system's).
    ``client``: one to reuse (a walk asks many replicas; None: one made for this call).
    """
    url = _status_url(base_url)
    try:
        # httpx's timeout is per phase (connect, read, ...); the scope bounds the whole.
        with trio.fail_after(timeout_s):
            async with AsyncExitStack() as stack:
                if client is None:
                    client = await stack.enter_async_context(httpx.AsyncClient(
                        timeout=timeout_s, trust_env=False, verify=ssl_context or True))
                response = await stack.enter_async_context(
                    client.stream("GET", url, headers=auth_headers(token)))
                body = await _bounded_body(response, url)
    except trio.TooSlowError:
        raise AdminUnreachable(url, f"no answer within {timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise AdminUnreachable(url, describe_failure(exc, certificate_hint=CA_HINT)) from exc
    code = response.status_code
    if code in (401, 403):
        raise AdminRefused(url, f"refused ({code}): {_detail(response, body)}", status_code=code)
    if code != 200:
        raise AdminUnreachable(url, f"answered {code}: {_detail(response, body)}",
                               status_code=code)
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise AdminUnreachable(url, "answered with a body that is not JSON") from exc
    if not isinstance(doc, dict):
        raise AdminUnreachable(url, "answered with JSON that is not an object")
    return doc


# -- watch -------------------------------------------------------------------------


def _line(message: str | bytes) -> tuple[str, dict[str, Any]]:
    """The line to print and the message's JSON object (empty when it is not one)."""
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
    try:
        doc = json.loads(text)
    except ValueError:
        doc = {}
    # Compact JSON never holds a raw control character; anything else is flattened to
    # one line, and its escapes never reach the terminal.
    return printable(text), doc if isinstance(doc, dict) else {}


@dataclass
class _Ended:
    """How one connection ended. ``kind``: done (max_events printed), closed (by the
    server: ``code``), refused (handshake: ``code`` is the HTTP status), lost."""

    kind: str
    why: str = ""
    code: int | None = None
    worked: bool = False  # at least one message arrived: reset the backoff


@asynccontextmanager
async def replica_websocket(url: str, token: str | None, ssl_context: ssl.SSLContext | None,
                            timeout_s: float) -> AsyncIterator[WebSocketConnection]:
    """The WebSocket at a ``ws://`` or ``wss://`` URL, each step within ``timeout_s``.

    First TCP, and for wss the TLS handshake (``ssl_context``; None: the system's store).
    So a refused certificate is told as what it is. Then the WebSocket handshake.
    A step that fails raises :class:`AdminUnreachable` (``cannot connect (...)``,
    ``no handshake ...``). A refused handshake raises ConnectionRejected.
    What the block raises comes out in an exception group.

    The TCP stream is opened and closed here, not by trio-websocket: its client leaves
    the socket open when the server closes first or refuses the handshake
    (trio-websocket 0.12). A reconnecting watcher would leak one per server restart.
    It also reports a refused certificate only as a handshake timeout.
    ``publish --wait`` connects the same way.
    """
    parts = _url(url)
    host, secure = parts.raw_host.decode("ascii"), parts.scheme == "wss"
    port = parts.port or (443 if secure else 80)
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream] | None = None
    try:
        try:
            with trio.fail_after(timeout_s):
                if secure:
                    stream = await trio.open_ssl_over_tcp_stream(
                        host, port, ssl_context=ssl_context or ssl.create_default_context())
                    await stream.do_handshake()
                else:
                    stream = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            why = (f"no connection within {timeout_s:g} s" if isinstance(exc, trio.TooSlowError)
                   else describe_failure(exc, certificate_hint=CA_HINT))
            raise AdminUnreachable(url, f"cannot connect ({why})") from exc
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else None
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(timeout_s) as handshake:
                # Host: brackets kept, no credentials; the resource with its query.
                ws = await wrap_client_stream(nursery, stream, parts.netloc.decode("ascii"),
                                              parts.raw_path.decode("ascii"),
                                              extra_headers=headers,
                                              max_message_size=MAX_MESSAGE_BYTES)
            if handshake.cancelled_caught:
                raise AdminUnreachable(url, f"no handshake within {timeout_s:g} s")
            yield ws
            nursery.cancel_scope.cancel()  # the connection's reader task
    finally:
        if stream is not None:
            await trio.aclose_forcefully(stream)


async def close_politely(ws: WebSocketConnection) -> None:
    """Close with 1000; a server that does not answer in time does not hold the caller up."""
    with trio.move_on_after(2.0):
        await ws.aclose()


_BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def _ended_by(group: BaseExceptionGroup[Any], worked: bool) -> _Ended:
    """How a connection ended, from what its block raised (in this order of precedence)."""
    if (unreachable := find_leaf(group, AdminUnreachable)) is not None:
        return _Ended("lost", unreachable.reason)
    if (rejected := find_leaf(group, ConnectionRejected)) is not None:
        return _Ended("refused", f"handshake refused ({rejected.status_code})",
                      rejected.status_code)
    if (broken := find_leaf(group, _BROKEN)) is not None:
        return _Ended("lost", f"connection failed ({describe_failure(broken)})")
    closed = find_leaf(group, ConnectionClosed)
    assert closed is not None  # the block returns unless one of the above ended it
    code = closed.reason.code if closed.reason is not None else None
    reason = (closed.reason.reason if closed.reason is not None else None) or ""
    why = f"closed by the server ({code}{' ' + reason if reason else ''})"
    return _Ended("closed", why, code, worked=worked)


async def watch_stream(
    url: str,
    out: TextIO,
    *,
    token: str | None = None,
    reconnect: bool = True,
    max_events: int | None = None,
    backoff_initial_s: float = 0.5,
    backoff_max_s: float = 30.0,
    connect_timeout_s: float = 10.0,
    rng: random.Random | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Follow the live stream at ``url`` (``ws://``, or an ``http://`` base).

    It writes one line per message to ``out``: the compact JSON the server sent.
    First the ``status`` message, then each event; ``ping`` heartbeats are not printed.
    JSON lines compose with ``jq`` and ``grep``; a prose one-liner would lose fields.

    With ``reconnect`` (the default) a lost connection, a close by the server (1001,
    1013) or a failed connect is retried. The backoff is exponential with jitter,
    ``backoff_initial_s`` doubling to ``backoff_max_s``, reset once a message arrives.
    Each new connection starts with a fresh ``status`` line.
    A server silent for three heartbeat periods counts as lost.
    Without ``reconnect`` it returns on a clean close (1000/1001), else raises
    :class:`AdminUnreachable`. It always returns after ``max_events`` printed lines.
    A refused token (401/403) always raises :class:`AdminRefused`: retrying cannot fix it.
    Reconnect notices go to the log (stderr), never to ``out``.
    ``ssl_context``: what a wss replica is verified with (None: the system's).
    """
    url = stream_url(url)
    backoff = Backoff(backoff_initial_s, backoff_max_s, rng)
    printed = 0

    async def connect_once() -> _Ended:
        """One connection, start to end (:func:`replica_websocket`)."""
        nonlocal printed
        idle_s, worked = DEFAULT_IDLE_TIMEOUT_S, False
        try:
            async with replica_websocket(url, token, ssl_context, connect_timeout_s) as ws:
                while True:
                    with trio.move_on_after(idle_s) as idle:
                        message = await ws.get_message()
                    if idle.cancelled_caught:
                        return _Ended("lost", f"no message (not even a heartbeat) for {idle_s:g} s",
                                      worked=worked)
                    worked = True
                    text, doc = _line(message)
                    if doc.get("type") == "ping":
                        continue
                    if doc.get("type") == "status":
                        heartbeat = doc.get("heartbeat_s")
                        if isinstance(heartbeat, int | float) and heartbeat > 0:
                            idle_s = 3 * float(heartbeat)
                    out.write(text + "\n")
                    out.flush()
                    printed += 1
                    if max_events is not None and printed >= max_events:
                        await close_politely(ws)
                        return _Ended("done", worked=True)
        except* (AdminUnreachable, ConnectionRejected, ConnectionClosed, *_BROKEN) as group:
            ended = _ended_by(group, worked)
        return ended

    while True:
        ended = await connect_once()
        if ended.kind == "done":
            return
        if ended.kind == "refused" and ended.code in (401, 403):
            raise AdminRefused(url, f"handshake refused ({ended.code}): missing or invalid token",
                               status_code=ended.code)
        if ended.kind == "closed" and ended.code == 1000:
            return  # the server ended the stream on purpose: not a loss to recover from
        if not reconnect:
            if ended.kind == "closed" and ended.code in CLEAN_CLOSE:
                return
            status = ended.code if ended.kind == "refused" else None
            raise AdminUnreachable(url, ended.why, status_code=status)
        if ended.worked:
            backoff.reset()
        # Equal jitter: at least half the delay (no hammering), randomised so
        # many watchers of one restarted server do not reconnect in lockstep.
        wait = backoff.next()
        log.warning("stream lost; reconnecting", url=url, why=ended.why, retry_in_s=round(wait, 3))
        await trio.sleep(wait)
