"""Follower mode: :class:`FollowerStore`, a store whose control plane is another replica.

Operators: docs/control-plane.md, "Follower mode", and docs/operations.md, "Follower mode".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Final

import httpx
import nacl.signing
import trio

from supervisor import reasons
from supervisor.controlplane.checks import refuse_unreadable
from supervisor.controlplane.errors import (
    ControlPlaneError,
    FailureCategory,
    StatementRefused,
    TooLarge,
)
from supervisor.controlplane.replica_name import REVISION_PATH, name_headers
from supervisor.controlplane.store import RevisionPointer
from supervisor.errors import describe_failure
from supervisor.logs import get_logger
from supervisor.sinks.lkg.accepted import AcceptedStatements, refusal_of, supersedes
from supervisor.sinks.lkg.errors import CacheError, CacheSkew
from supervisor.sinks.lkg.fileformat import MAGIC, MAX_HEADER_BYTES, SIGNATURE_BYTES, decode_file
from supervisor.sinks.lkg.keys import parse_trusted
from supervisor.sinks.lkg.statement import Statement
from supervisor.sinks.state import Candidate
from supervisor.threads import FILE_IO_DEADLINE_S, ThreadDeadline, in_thread
from supervisor.tlsconfig import upstream_context
from supervisor.tokenfile import read_token

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig

__all__ = ["ERROR_BODY_BYTES", "REVISION_PATH", "FollowerStore", "forward_path", "upstream_token"]

log = get_logger("controlplane")

#: The route a replica serves its signed revision on (admin.routes serves it here).
#: Connecting to the upstream replica: its revision fetches and its stream (upstream_hint).
CONNECT_TIMEOUT_S = 5.0
#: At most this much of a non-200 answer's body is read (for the log line).
ERROR_BODY_BYTES: Final = 4096
# Framing around the body: magic, length prefix, header, signature.
_FRAMING_BYTES = len(MAGIC) + 4 + MAX_HEADER_BYTES + SIGNATURE_BYTES
_MAX_ETAG_CHARS = 256
#: The longest message of a failed fetch (an upstream's error text can be anything).
MAX_ERROR_CHARS: Final = 500
#: How far ahead of this replica's clock a statement may have been issued (ordinary skew).
#: Beyond it the root's clock is wrong: accepted, such a statement would become the
#: highest, so the root's corrected refreshes (issued "earlier") would be refused as
#: rollback, and a new root identity refused, until that moment; and its expiry, as far
#: ahead, would show the tree fresh long after the root stopped.
MAX_CLOCK_AHEAD_S: Final = 60.0
# What an upstream can make httpx or our parsing raise besides httpx.HTTPError:
# a header that cannot be encoded or decoded (UnicodeError is a ValueError), a
# malformed URL or value, a missing part. Mapped to ``invalid`` at this boundary.
_MALFORMED = (ValueError, TypeError, LookupError, httpx.InvalidURL, httpx.StreamError)


async def _read_up_to(response: httpx.Response, limit: int) -> bytes:
    """The raw body as it arrives, read no further than the chunk that takes it past
    ``limit`` (a body some transport already read: whole, at once)."""
    try:
        return response.content
    except httpx.ResponseNotRead:
        pass
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)


def forward_path(cache_path: str | None) -> str | None:
    """Where a follower keeps, beside the cache file, the root's signed bytes of the statement
    it serves (None without a cache)."""
    return None if cache_path is None else cache_path + ".upstream"


def upstream_token(config: ControlPlaneConfig) -> str | None:
    """The upstream's admin token (``[control_plane].token_file``; None: unset);
    :class:`~supervisor.errors.ConfigError` on that key when the file is unusable."""
    if config.token_file is None:
        return None
    return read_token(config.token_file, "$.control_plane.token_file")


@dataclass(frozen=True)
class _Accepted:
    statement: Statement
    candidate: Candidate


class FollowerStore:
    """A RevisionSource that polls an upstream replica's ``GET /v1/revision``.

    ``[control_plane].url`` names the upstream's admin address. Its answer is the
    root's signed statement and its revision, in the signed cache's file format
    (:mod:`supervisor.sinks.lkg.fileformat`). The poll is conditional: ``If-None-Match``
    carries the ETag of the statement held, computed from the verified statement
    (:meth:`~supervisor.sinks.lkg.statement.Statement.etag`), never the upstream's
    header echoed. An unchanged upstream answers 304 and costs no body.

    An accepted statement (:meth:`_verify`) raises the highest, durably, before
    anything serves it. A failed write is retried at every poll, a 304 included.
    The revision then goes to the loop as a :class:`~supervisor.sinks.state.Candidate`
    carrying the statement. The loop compiles it with this replica's own secrets.
    Once it serves, it passes the root's signed bytes on unchanged
    (:func:`forward_path`). So a follower of a follower verifies the *root's*
    signature: a hub can withhold or delay a statement (until ``stale``), never forge
    or replay one.

    Whatever the upstream sends ends as a :class:`ControlPlaneError`: nothing on the
    fetch path ends the convergence child. Connection errors (their innermost cause
    told, :func:`~supervisor.errors.describe_failure`), timeouts and 5xx are
    ``unavailable``; 401/403 ``denied``; any other status ``invalid``. It is a
    RevisionSource only: the commands refuse it
    (:func:`~supervisor.controlplane.factory.open_admin`). Its identity is the
    upstream's address, which ``/status`` shows as the source.
    """

    def __init__(
        self,
        config: ControlPlaneConfig,
        *,
        max_schema_version: int,
        accepted: AcceptedStatements | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._url = config.url.rstrip("/")
        self._where = f"{self._url}{REVISION_PATH}"
        self._max_bytes = config.max_revision_bytes
        self._max_schema = max_schema_version
        self._trusted: dict[str, nacl.signing.VerifyKey] = parse_trusted(
            config.trusted_keys, where_key="$.control_plane.trusted_keys")
        self._fetch_timeout_s = config.fetch_timeout_s
        self._root_identity = config.root_identity
        # Held by the daemon, so a restarted child keeps the highest accepted.
        self._highest = accepted if accepted is not None else AcceptedStatements(None)
        self._clock = clock
        headers = {"accept": "application/octet-stream", "accept-encoding": "identity"}
        # Read at every start of the convergence child (the store is made there).
        token = upstream_token(config)
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        self._client = httpx.AsyncClient(
            base_url=self._url, headers=headers,
            timeout=httpx.Timeout(config.fetch_timeout_s,
                                  connect=min(CONNECT_TIMEOUT_S, config.fetch_timeout_s)),
            # HTTP_PROXY and friends must not see the upstream's token nor its statements.
            trust_env=False,
            transport=transport,  # tests: an upstream served in-process
            verify=upstream_context(config) or True,
        )
        self._accepted: _Accepted | None = None
        # The ETag of the upstream's last statement kept out for the held one (a sibling's
        # or a refresh expiring earlier): asked with it, an unchanged upstream answers 304.
        self._passed_over: str | None = None

    def __repr__(self) -> str:
        return f"FollowerStore({self._url!r})"

    @property
    def identity(self) -> str:
        return f"upstream:{self._url}"

    @property
    def highest(self) -> Statement | None:
        """The highest statement ever accepted (persisted beside the cache)."""
        return self._highest.highest

    # -- the source -------------------------------------------------------------

    async def observe(self) -> RevisionPointer:
        """One signed fetch (a 304 when unchanged): the revision comes whole with its pointer."""
        candidate = (await self._fetch()).candidate
        return RevisionPointer(candidate.id, candidate.body_sha256, self.identity,
                               sequence=candidate.sequence, statement=candidate.statement)

    async def hydrate(self) -> Candidate | None:
        return (self._accepted or await self._fetch()).candidate

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- one fetch -----------------------------------------------------------------

    async def _persist(self, call: Callable[[], object]) -> object:
        try:
            return await in_thread(call, dependency="files", deadline_s=FILE_IO_DEADLINE_S,
                                   what="the accepted statement write")
        except (CacheError, ThreadDeadline) as exc:
            # Held in memory regardless: this process still refuses what it should.
            log.warning("cannot persist the highest accepted statement; a restart would "
                        "forget it", error=str(exc))
            return None

    async def _fetch(self) -> _Accepted:
        """GET the upstream's statement (conditionally), judge it, remember it.

        One attempt (connect, headers, body) ends within ``fetch_timeout_s`` as a
        whole: a slow drip is ``unavailable``. A sibling root's statement of the same
        intent is no refusal; of the two, the later-expiring one is kept.
        """
        # No file to look at (no [cache].path): no thread to spend.
        if self._highest.path is not None and await self._persist(self._highest.sync):
            self._accepted = None  # reset meanwhile: the next statement is judged afresh
            self._passed_over = None
        held = self._accepted
        try:
            with trio.fail_after(self._fetch_timeout_s):
                data = await self._get(held)
        except trio.TooSlowError as exc:
            raise ControlPlaneError(
                f"upstream {self._where} sent no complete answer within "
                f"{self._fetch_timeout_s:g} s ([control_plane].fetch_timeout_s)",
                category=FailureCategory.UNAVAILABLE,
            ) from exc
        if data is None:
            assert held is not None  # _get answers None only to a conditional request
            self._refuse_expired(held.statement)
            return held
        accepted = self._verify(data)
        if held is not None and _same_intent(accepted.statement, held.statement) and (
                not supersedes(accepted.statement, held.statement)):
            # A sibling root's earlier-issued statement, or a refresh expiring earlier:
            # the held one stays, and this one's ETag is asked with next time.
            self._passed_over = accepted.statement.etag()
            return held
        self._passed_over = None
        if supersedes(accepted.statement, self._highest.highest):
            await self._persist(partial(self._highest.accept, accepted.statement))
        self._accepted = accepted
        return accepted

    async def _get(self, held: _Accepted | None) -> bytes | None:
        """The statement's bytes; None for a 304 to a conditional request.

        Only ``identity`` encoding is read (else ``corrupt``). The body is counted as
        its raw bytes arrive, refused past the bound (``denied``). A malformed header
        (a non-ASCII ``ETag``) is ``invalid``. The environment's proxies are ignored.
        """
        headers = ({"if-none-match": self._passed_over or held.statement.etag()}
                   if held is not None else {})
        headers.update(name_headers())  # this replica, for its upstream's fleet view
        try:
            async with self._client.stream("GET", REVISION_PATH, headers=headers) as response:
                self._check_etag(response)
                if response.status_code == 304 and held is not None:
                    return None
                if response.status_code != 200:
                    detail = await self._read_some(response)
                    raise self._status_error(response.status_code, detail)
                self._check_encoding(response)
                return await self._read_bounded(response)
        except (httpx.HTTPError, OSError) as exc:
            raise ControlPlaneError(
                self._failure("unreachable", exc), category=FailureCategory.UNAVAILABLE,
            ) from exc
        except _MALFORMED as exc:
            raise ControlPlaneError(
                self._failure("sent a malformed answer", exc), category=FailureCategory.INVALID,
            ) from exc

    def _failure(self, what: str, exc: Exception) -> str:
        """``upstream <where> <what>: <the error and its innermost cause>``, in at most
        :data:`MAX_ERROR_CHARS` characters."""
        prefix = f"upstream {self._where} {what}: "
        return (prefix + describe_failure(exc, limit=max(0, MAX_ERROR_CHARS - len(prefix)),
                                          certificate_hint="[control_plane].ca_file")
                )[:MAX_ERROR_CHARS]

    def _check_etag(self, response: httpx.Response) -> None:
        for value in response.headers.get_list("etag"):
            if (len(value) > _MAX_ETAG_CHARS or not value.isascii()
                    or not value.isprintable()):
                raise ControlPlaneError(
                    f"upstream {self._where} sent a malformed ETag header "
                    f"({value[:40]!a}): a broken or hostile upstream",
                    category=FailureCategory.INVALID,
                )

    def _check_encoding(self, response: httpx.Response) -> None:
        encodings = [part.strip().lower()
                     for value in response.headers.get_list("content-encoding")
                     for part in value.split(",") if part.strip()]
        if any(encoding != "identity" for encoding in encodings):
            raise StatementRefused(
                reasons.CORRUPT,
                f"upstream {self._where} sent Content-Encoding {ascii(', '.join(encodings))[:80]}"
                " after Accept-Encoding: identity (only identity is read: a compressed "
                "body could expand past every bound)",
            )

    async def _read_some(self, response: httpx.Response) -> str:
        """At most ERROR_BODY_BYTES of the body (an endless body is never read whole)."""
        data = await _read_up_to(response, ERROR_BODY_BYTES - 1)
        return data[:ERROR_BODY_BYTES].decode("utf-8", "replace")

    async def _read_bounded(self, response: httpx.Response) -> bytes:
        """The raw body, refused (``denied``) as soon as it passes the bound."""
        limit = self._max_bytes + _FRAMING_BYTES
        declared = response.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise TooLarge(None, int(declared), self._max_bytes)
        data = await _read_up_to(response, limit)
        if len(data) > limit:
            raise TooLarge(None, len(data), self._max_bytes)
        return data

    def _status_error(self, status: int, detail: str) -> ControlPlaneError:
        text = " ".join(detail.split())[:300]
        message = f"upstream {self._where} answered {status}: {text}"
        if status in (401, 403):
            return ControlPlaneError(message + " (check [control_plane].token_file)",
                                     category=FailureCategory.DENIED)
        if status >= 500:
            return ControlPlaneError(message, category=FailureCategory.UNAVAILABLE)
        return ControlPlaneError(message, category=FailureCategory.INVALID)

    def _stale(self, statement: Statement, why: str) -> StatementRefused:
        return StatementRefused(reasons.STALE, f"{self._where}: the root's statement (sequence "
                                f"{statement.sequence}, revision {statement.revision}) {why}")

    def _refuse_ahead(self, statement: Statement) -> None:
        ahead = (statement.issued_at - self._clock()).total_seconds()
        if ahead > MAX_CLOCK_AHEAD_S:
            raise self._stale(statement, f"was issued at {statement.issued_at.isoformat()}, "
                              f"{ahead:.0f} s ahead of this replica's clock (more than "
                              f"{MAX_CLOCK_AHEAD_S:g} s): the root's clock or this one is "
                              "wrong; its freshness cannot be told")

    def _refuse_expired(self, statement: Statement) -> None:
        now = self._clock()
        if statement.expired(now):
            raise self._stale(statement, f"expired at {statement.expires_at.isoformat()}, "
                              f"{(now - statement.expires_at).total_seconds():.0f} s ago: the "
                              "root has not signed a fresh one (its control plane unreadable?) "
                              "or a hop froze it")

    def _verify(self, data: bytes) -> _Accepted:
        """The statement accepted, or a ControlPlaneError for the first check it fails.

        In order:

        1. framing and signature against ``[control_plane].trusted_keys`` (the root's keys,
           never this replica's cache key). A bad signature or an untrusted key is
           ``denied``; damaged framing or a body unlike its signed header ``corrupt``. A
           version 1 file carries no statement (an older root): ``stale``.
        2. ``issued_at`` at most :data:`MAX_CLOCK_AHEAD_S` ahead, else ``stale``.
        3. against the highest accepted and the root it pins
           (:func:`~supervisor.sinks.lkg.accepted.refusal_of`). Another root is ``denied``
           (until ``follower reset`` or ``root_identity``). A lower sequence is
           ``rollback``; the same sequence with another body ``corrupt``.
        4. ``expires_at`` not passed, else ``stale`` (a 304's held statement too).
        5. the body's size (``denied``) and ``schema_version`` (``incompatible``).
        """
        try:
            header, body = decode_file(data, self._where, self._trusted)
        except CacheSkew as exc:
            raise ControlPlaneError(str(exc), category=FailureCategory.INVALID) from exc
        except CacheError as exc:
            reason = reasons.DENIED if exc.reason == reasons.DENIED else reasons.CORRUPT
            # What the upstream served is its statement, not a cache of ours.
            detail = f"upstream statement {exc.path}: {exc.reason}: {exc.detail}"
            raise StatementRefused(
                reason, detail.replace("cache.trusted_keys", "control_plane.trusted_keys"),
                revision=exc.revision if reason == reasons.CORRUPT else None,
            ) from exc
        statement = header.statement(data)
        if statement is None:
            raise StatementRefused(
                reasons.STALE,
                f"{self._where} served a format_version {header.format_version} file, which "
                "carries no signed statement (sequence, expiry): its freshness cannot be "
                "told; upgrade the root",
            )
        if header.revision < 1:
            raise StatementRefused(reasons.CORRUPT, f"{self._where}: signed revision "
                                   f"{header.revision} is not a revision id")
        self._refuse_ahead(statement)
        refused = refusal_of(statement, self._highest.highest, self._root_identity)
        if refused is not None:
            raise StatementRefused(refused[0], f"{self._where}: {refused[1]}")
        self._refuse_expired(statement)
        refuse_unreadable(header.revision, len(body), header.schema_version,
                          max_revision_bytes=self._max_bytes, max_schema_version=self._max_schema)
        candidate = Candidate(
            id=header.revision,
            body_sha256=bytes.fromhex(header.body_sha256),  # verified by decode_file
            body=body,
            schema_version=header.schema_version,
            sequence=statement.sequence,
            statement=statement,
        )
        return _Accepted(statement, candidate)


def _same_intent(one: Statement, other: Statement) -> bool:
    """One root's one intent: root identity, sequence, revision and body (siblings' match)."""
    return (one.root, one.sequence, one.revision, one.body_sha256) == (
        other.root, other.sequence, other.revision, other.body_sha256)
