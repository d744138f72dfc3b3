"""``publish --wait``: follow a replica's stream until it reports a revision active or refused."""

from __future__ import annotations

import argparse
import json
import ssl
import sys
from typing import Any, Literal

import httpx
import msgspec
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError

from supervisor.admin.client import (
    auth_headers,
    close_politely,
    converge_url,
    replica_websocket,
    stream_url,
)
from supervisor.admin.errors import AdminUnreachable
from supervisor.errors import UsageError, describe_failure, find_leaf
from supervisor.reasons import FOLLOWER_STATES

__all__ = ["ReplicaResult", "fleet_urls", "judge", "wait_for_revision"]

State = Literal["active", "refused", "superseded", "timeout"]
RETRY_S = 0.25
CONNECT_TIMEOUT_S = 10.0


class ReplicaResult(msgspec.Struct):
    """One replica's verdict (an item of ``publish --wait --json``'s ``replicas``)."""

    url: str
    state: State
    reason: str | None = None
    detail: str | None = None


def judge(doc: Any, revision: int, url: str) -> ReplicaResult | None:
    """The verdict one stream message gives about ``revision`` (None: not yet known).

    - ``active``: the replica reports it active (published, or the status's ``active``);
    - ``refused``: a rejection names it (the reason label and detail kept);
    - ``superseded``: it already serves a newer revision id (someone published after us).

    The first ``status`` message is judged too: it is the state when the stream
    connected, so a revision live or refused before then is seen.
    """
    if not isinstance(doc, dict):
        return None
    kind = doc.get("type")
    rev = doc.get("revision") if kind == "status" else None
    status = rev if isinstance(rev, dict) else {}
    active = status.get("active")
    if _is(doc.get("revision") if kind == "published" else active, revision):
        return ReplicaResult(url, "active")
    rejection = doc if kind == "rejected" else status.get("last_rejection")
    if isinstance(rejection, dict) and _is(rejection.get("revision"), revision):
        return ReplicaResult(url, "refused", _text(rejection.get("reason")),
                             _text(rejection.get("detail")))
    if isinstance(active, int) and not isinstance(active, bool) and active > revision:
        return ReplicaResult(url, "superseded", None, f"revision {active} is active there")
    return None


def _is(value: Any, revision: int) -> bool:
    """``value`` is the revision id ``revision`` (JSON ``true`` is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value == revision


def _text(value: Any) -> str | None:
    return None if value is None else " ".join(str(value).split())


async def _nudge(base: str, token: str | None, ssl_context: ssl.SSLContext | None) -> None:
    try:
        async with httpx.AsyncClient(timeout=5, trust_env=False,
                                     verify=ssl_context or True) as client:
            await client.post(converge_url(base), headers=auth_headers(token))
    except httpx.HTTPError:
        pass  # best effort: the stream decides


async def _follow(base: str, revision: int, token: str | None,
                  ssl_context: ssl.SSLContext | None) -> ReplicaResult:
    """One connection: the verdict, or AdminUnreachable (no connection, no handshake),
    ConnectionRejected, ConnectionClosed or a broken stream."""
    async with replica_websocket(stream_url(base), token, ssl_context,
                                 CONNECT_TIMEOUT_S) as ws, trio.open_nursery() as nursery:
        nudged = False
        while True:
            message = await ws.get_message()
            try:
                doc = json.loads(message)
            except ValueError:
                continue
            verdict = judge(doc, revision, base)
            if verdict is not None:
                await close_politely(ws)
                nursery.cancel_scope.cancel()
                return verdict
            if not nudged:
                nudged = True
                nursery.start_soon(_nudge, base, token, ssl_context)


def _failure(exc: BaseException) -> str:
    """How one connection that gave no verdict ended, for the report."""
    if isinstance(exc, AdminUnreachable):
        return f"unreachable: {exc.reason}"
    if isinstance(exc, ConnectionRejected):
        return f"handshake refused ({exc.status_code})"
    if isinstance(exc, HandshakeError):
        return f"no handshake: {describe_failure(exc)}"
    if isinstance(exc, ConnectionClosed):
        return f"stream closed: {exc}"
    return f"unreachable: {describe_failure(exc)}"


async def wait_for_revision(base: str, revision: int, token: str | None,
                            timeout_s: float,
                            ssl_context: ssl.SSLContext | None = None) -> ReplicaResult:
    """Follow ``base``'s stream until ``revision`` is active, refused or superseded there.

    ``timeout`` when none of that happened before the deadline. A replica unreachable, or
    whose connection drops, is retried until then; the last error is kept. Once connected,
    it asks the replica to converge now (``POST /v1/converge``, best effort, not awaited). A
    replica that only polls would otherwise wait its poll interval. The stream alone is
    judged.
    """
    last = "no answer yet"
    with trio.move_on_after(timeout_s):
        while True:
            try:
                return await _follow(base, revision, token, ssl_context)
            except* (AdminUnreachable, HandshakeError, ConnectionClosed, OSError,
                     trio.BrokenResourceError) as group:
                last = _failure(find_leaf(group, BaseException) or group)
            await trio.sleep(RETRY_S)
    return ReplicaResult(base, "timeout", None,
                         f"revision {revision} not active after {timeout_s:g} s ({last})")


def fleet_urls(args: argparse.Namespace, urls: list[str], token: str | None,
               ssl_context: ssl.SSLContext | None) -> list[str]:
    """Every replica the walk from the one ``--url`` finds and may follow (``status --fleet``);
    each one it cannot (unreachable, unverified) said on stderr."""
    from supervisor.commands.status import fleet_rows

    if len(urls) != 1 or not urls[0].startswith(("http://", "https://")):
        raise UsageError("--fleet walks from one root: pass one --url http(s)://HOST:PORT")
    rows = fleet_rows(args, urls[0], token, ssl_context)
    for row in rows:
        if row.state not in FOLLOWER_STATES:
            print(f"{row.url}: {row.state}: {row.detail} (not waited for)", file=sys.stderr)
    return [row.url for row in rows if row.state in FOLLOWER_STATES]
