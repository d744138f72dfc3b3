"""``status --fleet``: the follower tree walked from its root, one row a replica."""

from __future__ import annotations

import argparse
import ssl
import struct
from collections.abc import Mapping
from typing import Any, Final

import httpx
import msgspec
import nacl.exceptions
import nacl.signing
import trio

from supervisor.admin.client import auth_headers, fetch_status
from supervisor.admin.errors import AdminUnreachable
from supervisor.admin.fleet import FollowersAnswer
from supervisor.admin.routes import FOLLOWERS_PATH, REVISION_PATH
from supervisor.bounds import quoted
from supervisor.commands.common import HTTP_SCHEMES, admin_url
from supervisor.controlplane.replica_name import follower_state
from supervisor.errors import describe_failure
from supervisor.reasons import UNAVAILABLE
from supervisor.sinks.lkg.fileformat import MAGIC, MAX_HEADER_BYTES, SIGNATURE_BYTES, Header

__all__ = ["HOP_TIMEOUT_S", "MAX_DEPTH", "MAX_REPLICAS", "MAX_WIDTH", "FleetRow", "walk"]

HOP_TIMEOUT_S: Final = 5.0
MAX_DEPTH: Final = 8
MAX_WIDTH: Final = 64
MAX_REPLICAS: Final = 256
#: The largest ``/v1/followers`` answer read (256 rows of bounded fields).
MAX_FOLLOWERS_BYTES: Final = 1024 * 1024
_HEAD_BYTES: Final = len(MAGIC) + 4 + MAX_HEADER_BYTES + SIGNATURE_BYTES
_LENGTH: Final = struct.Struct(">I")
#: Hops asked at once (below trio's worker threads, which resolve the names).
HOPS_AT_ONCE: Final = 16


class FleetRow(msgspec.Struct, kw_only=True):
    """One replica of the walk (``status --fleet --json``'s ``replicas``).

    ``state`` is ``converged``, ``converging``, ``refusing`` or ``stale`` (as its
    ``/status`` tells), and only these are walked on. Otherwise ``unreachable``,
    ``unverified`` (it does not serve the root's statement) or ``cycle``.
    """

    depth: int
    url: str
    sequence: int | None = None
    state: str
    reason: str | None = None
    detail: str | None = None
    lag_s: float | None = None


class _Hop(msgspec.Struct):
    row: FleetRow
    header: Header | None = None
    followers: list[str] = msgspec.field(default_factory=list)
    #: What the walk found from it: the rows below its own, in its followers' order.
    below: list[_Hop] = msgspec.field(default_factory=list)


class _Refused(Exception):
    """This replica is not walked on (``unverified``): the reason label and why."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason, self.detail = reason, detail
        super().__init__(detail)


def _state_of(rev: dict[str, Any]) -> tuple[str, str | None]:
    """A replica's state and reason, read from the ``revision`` section of its ``/status``
    (:func:`follower_state`)."""
    rejection = rev.get("last_rejection")
    reason = rejection.get("reason") if isinstance(rejection, dict) else None
    statement = rev.get("statement")
    desired = rev.get("desired")
    return follower_state(
        stale=isinstance(statement, dict) and statement.get("stale") is True,
        failing=bool(rev.get("consecutive_failures")) and rev.get("control_plane_up") is True,
        reason=None if reason is None else str(reason),
        serves_desired=desired is not None and rev.get("active") == desired)


def _label(reason: object) -> tuple[str | None, str | None]:
    """A replica's reason as (label, detail): one that is not a label is ``corrupt``, quoted."""
    if reason is None or (isinstance(reason, str) and len(reason) <= 32
                          and reason.replace("_", "").isalpha() and reason.isascii()):
        return reason, None
    return "corrupt", f"/status says reason {quoted(str(reason))}, which is no reason label"


def _number(value: Any) -> float | None:
    """A finite number of seconds (NaN, which Python's JSON reads, is none)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if number and -1e15 <= value <= 1e15 else None


async def _bounded(response: httpx.Response, limit: int) -> bytes:
    data = b""
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= limit:
            break
    return data[:limit]


def _verified(head: bytes, trusted: Mapping[str, nacl.signing.VerifyKey]) -> Header:
    """The signed header at the start of a ``/v1/revision`` answer; its signature checked
    when keys are given. _Refused when it is not one."""
    if not head.startswith(MAGIC) or len(head) < len(MAGIC) + _LENGTH.size:
        raise _Refused("corrupt", "/v1/revision is not a signed statement")
    (length,) = _LENGTH.unpack_from(head, len(MAGIC))
    end = len(MAGIC) + _LENGTH.size + length
    if length > MAX_HEADER_BYTES or len(head) < end + SIGNATURE_BYTES:
        raise _Refused("corrupt", "/v1/revision is truncated or oversized")
    try:
        header = msgspec.json.decode(head[len(MAGIC) + _LENGTH.size:end], type=Header)
    except msgspec.DecodeError as exc:
        raise _Refused("corrupt", f"/v1/revision header: {exc}") from None
    if header.root is None or header.sequence is None:
        raise _Refused("stale", "/v1/revision carries no statement")
    if trusted:
        try:
            trusted[header.key_id].verify(head[:end], head[end:end + SIGNATURE_BYTES])
        except (KeyError, nacl.exceptions.BadSignatureError):
            raise _Refused("denied", "/v1/revision is not signed by a trusted key "
                           f"(key id {header.key_id})") from None
    return header


def _listed(answer: bytes, limit: int) -> tuple[list[str], int]:
    """The followers' URLs of a ``/v1/followers`` answer (each a valid replica address),
    at most ``limit`` of them, and how many more were listed."""
    try:
        rows = msgspec.json.decode(answer, type=FollowersAnswer).followers
    except msgspec.DecodeError as exc:
        raise _Refused("corrupt", f"/v1/followers: {exc}") from None
    check = admin_url(HTTP_SCHEMES)
    urls: list[str] = []
    for row in rows:
        try:
            url = check(row.url).rstrip("/")
        except argparse.ArgumentTypeError:
            continue
        if url not in urls:
            urls.append(url)
    return urls[:limit], max(0, len(urls) - limit)


async def _ask(client: httpx.AsyncClient, url: str, row: FleetRow, token: str | None,
               ssl_context: ssl.SSLContext | None, anchor: Header | None,
               trusted: Mapping[str, nacl.signing.VerifyKey]) -> _Hop:
    """One replica's three answers, judged; _Refused when it is not walked on."""
    doc = await fetch_status(url, token, timeout_s=HOP_TIMEOUT_S, ssl_context=ssl_context,
                             client=client)
    rev = doc.get("revision")
    rev = rev if isinstance(rev, dict) else {}
    sequence = rev.get("sequence")
    row.sequence = sequence if isinstance(sequence, int) else None
    row.lag_s = _number(rev.get("lag_s"))
    async with client.stream("GET", url + REVISION_PATH) as response:
        if response.status_code != 200:
            raise _Refused(UNAVAILABLE,
                           f"/v1/revision answered {response.status_code}")
        header = _verified(await _bounded(response, _HEAD_BYTES), trusted)
    if anchor is not None and (header.root != anchor.root or header.key_id != anchor.key_id
                               or (header.sequence or 0) > (anchor.sequence or 0)):
        raise _Refused("denied",
                       f"serves a statement of root {header.root!a} (key id {header.key_id}, "
                       f"sequence {header.sequence}), not the root's")
    async with client.stream("GET", url + FOLLOWERS_PATH) as response:
        answer = (await _bounded(response, MAX_FOLLOWERS_BYTES + 1)
                  if response.status_code == 200 else b'{"followers": []}')
    if len(answer) > MAX_FOLLOWERS_BYTES:
        raise _Refused("denied", f"/v1/followers is over {MAX_FOLLOWERS_BYTES} "
                       "bytes")
    followers, more = _listed(answer, MAX_WIDTH)
    row.state, reason = _state_of(rev)
    row.reason, row.detail = _label(reason)
    if more and row.detail is None:
        row.detail = f"{more} more followers listed, not walked (at most {MAX_WIDTH})"
    return _Hop(row, header, followers)


async def _hop(client: httpx.AsyncClient, url: str, depth: int, token: str | None,
               ssl_context: ssl.SSLContext | None, anchor: Header | None,
               trusted: Mapping[str, nacl.signing.VerifyKey],
               turns: trio.CapacityLimiter) -> _Hop:
    """One replica, within HOP_TIMEOUT_S from its turn: its row, and what to walk on.

    ``turns`` lets at most :data:`HOPS_AT_ONCE` run. So names slow to resolve, listed
    by a hostile follower, cannot spend an honest replica's time. Nothing to walk on when refused.
    """
    row = FleetRow(depth=depth, url=url, state="unreachable", reason=UNAVAILABLE)
    try:
        async with turns:
            with trio.fail_after(HOP_TIMEOUT_S):
                return await _ask(client, url, row, token, ssl_context, anchor, trusted)
    except trio.TooSlowError:
        row.detail = f"no complete answer within {HOP_TIMEOUT_S:g} s"
    except AdminUnreachable as exc:
        row.detail = exc.reason
    except httpx.HTTPError as exc:
        row.detail = describe_failure(exc)
    except _Refused as exc:
        row.state, row.reason, row.detail = "unverified", exc.reason, exc.detail
    return _Hop(row)


async def walk(root: str, token: str | None, ssl_context: ssl.SSLContext | None,
               trusted: Mapping[str, nacl.signing.VerifyKey]) -> list[FleetRow]:
    """Every replica found from ``root``, depth first in the order they were listed.

    Level by level, each replica is asked three things within :data:`HOP_TIMEOUT_S` in all.
    ``/status``: sequence, state, reason, lag. The head of ``/v1/revision``: its statement.
    ``/v1/followers``: its next hops, as it last saw them.

    A follower may say anything about itself and its followers. So a replica is walked on
    only when it serves a statement of the root's. That is: the same root identity and
    signing key id, a sequence not above the root's, and (given ``trusted``) a signature
    that verifies. An address seen before is a ``cycle`` row, not walked again. At most
    :data:`MAX_DEPTH` levels, :data:`MAX_WIDTH` followers of one replica and
    :data:`MAX_REPLICAS` rows; what is left out is said on the row that named it.
    """
    root = root.rstrip("/")
    seen = {root}
    async with httpx.AsyncClient(timeout=HOP_TIMEOUT_S, trust_env=False,
                                 verify=ssl_context or True,
                                 headers=auth_headers(token)) as client:
        turns = trio.CapacityLimiter(HOPS_AT_ONCE)
        first = await _hop(client, root, 0, token, ssl_context, None, trusted, turns)
        anchor = first.header
        if anchor is None and first.row.state != "unreachable":
            first.row.detail = "serves no statement to check its followers by: not walked"
        level = [first] if anchor is not None else []
        depth = 0

        async def one(url: str, at: int, into: dict[str, _Hop]) -> None:
            into[url] = await _hop(client, url, at, token, ssl_context, anchor, trusted, turns)

        while level and depth < MAX_DEPTH and len(seen) < MAX_REPLICAS:
            depth += 1
            asked: dict[str, _Hop] = {}  # each new address, by the replica listing it first
            for hop in level:
                for url in hop.followers:
                    if url not in seen and len(seen) < MAX_REPLICAS:
                        seen.add(url)
                        asked[url] = hop
            found: dict[str, _Hop] = {}
            async with trio.open_nursery() as nursery:
                for url in asked:
                    nursery.start_soon(one, url, depth, found)
            for hop in level:
                hop.below = [found[url] if asked.get(url) is hop else _Hop(FleetRow(
                    depth=depth, url=url, state="cycle",
                    detail=f"listed by {hop.row.url}, already walked"))
                    for url in hop.followers if url in seen]
            level = [found[url] for url in asked if found[url].header is not None
                     and found[url].row.state != "unverified"]
    rows: list[FleetRow] = []

    def emit(hop: _Hop) -> None:
        rows.append(hop.row)
        for below in hop.below:
            emit(below)

    emit(first)
    return rows
