"""Follower mode: a store whose control plane is another replica (docs/control-plane.md).

``[control_plane].url = "http(s)://HOST:PORT"`` names an upstream replica's
admin address. The store polls its ``GET /v1/revision`` (the upstream's active
revision in the signed last-known-good file format,
:mod:`supervisor.sinks.lkg.fileformat`), conditionally: ``If-None-Match`` with
the ETag (``"<revision>"``) of the last revision it accepted, so an unchanged
upstream answers 304 and costs no body.

Every response is verified against this replica's own ``[cache].trusted_keys``
before anything else is believed, in this order:

* framing and signature (:func:`~supervisor.sinks.lkg.fileformat.decode_file`):
  a signature that does not verify or an untrusted key is ``denied`` (nothing in
  an unauthenticated response is believed, so no revision is named); damaged
  framing, or a body that does not match its signed header, is ``corrupt``;
* a signed ``revision`` lower than the highest this process has accepted from
  the upstream is ``rollback`` (:class:`RolledBack`): a replayed old response;
* the body larger than ``max_revision_bytes`` is ``denied`` (:class:`TooLarge`;
  the download stops at that size), a ``schema_version`` newer than this build
  reads is ``incompatible``.

Only then is the revision handed to the loop, as a :class:`LoadedRevision`
exactly like one read from PostgreSQL: the loop compiles it with this replica's
own secrets, and publishes, caches and reports it the same way. The loop's
``observe`` is this store's conditional GET; ``hydrate`` returns the revision
that GET verified (fetching first when it holds none), so the two always agree.

Signatures pass through the tree: every response accepted is also written,
byte for byte, to ``forward_path`` (``<[cache].path>.upstream``), and this
replica's own ``GET /v1/revision`` serves that file (once its revision is the
active one) instead of re-signing. A follower of a follower therefore verifies
the *root's* signature, and trusts the root's key, not the hub's: a
compromised hub can withhold or delay revisions, but cannot forge one.

Failures map to the store's categories: connection errors, timeouts, 5xx and
503 (the upstream has nothing active yet, or no signing key) are
``unavailable`` (retried with the loop's backoff while the last good snapshot
keeps serving); 401/403 are ``denied``; any other status is ``invalid``.
``publish`` and ``migrate`` are refused (``invalid``): a follower has no
control plane of its own. The identity reported to the loop is the upstream's
address, which is what ``/status`` shows as the source.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import nacl.signing
import trio

from supervisor import reasons
from supervisor.controlplane.errors import (
    ControlPlaneError,
    FailureCategory,
    Incompatible,
    TooLarge,
)
from supervisor.controlplane.migrations import Migrated
from supervisor.controlplane.revisions import DesiredChange, RevisionSummary
from supervisor.controlplane.store import LoadedRevision, RevisionPointer
from supervisor.errors import ConfigError
from supervisor.logs import get_logger
from supervisor.sinks.atomic import write_atomic
from supervisor.sinks.lkg.errors import CacheError, CacheSkew
from supervisor.sinks.lkg.fileformat import MAGIC, MAX_HEADER_BYTES, SIGNATURE_BYTES, decode_file
from supervisor.sinks.lkg.keys import parse_trusted
from supervisor.tlsconfig import upstream_context

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig

__all__ = ["FORWARD_SUFFIX", "REVISION_PATH", "FollowerStore", "RolledBack", "forward_path"]

log = get_logger("controlplane")

REVISION_PATH = "/v1/revision"
#: Beside the cache file: the upstream's signed bytes of the revision last accepted.
FORWARD_SUFFIX = ".upstream"
CONNECT_TIMEOUT_S = 5.0
# Framing around the body: magic, length prefix, header, signature.
_FRAMING_BYTES = len(MAGIC) + 4 + MAX_HEADER_BYTES + SIGNATURE_BYTES


def forward_path(cache_path: str | None) -> str | None:
    """Where a follower keeps the upstream's signed bytes (None without a cache)."""
    return None if cache_path is None else cache_path + FORWARD_SUFFIX


def _read_token(path: str) -> str:
    """The upstream's admin token; ConfigError naming the key when unusable."""
    where = "$.control_plane.token_file"
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, f"cannot read {path}: {exc}") from exc
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(where, f"{path}: expected one token of printable ASCII")
    return token


class RolledBack(ControlPlaneError):
    """The upstream served a validly signed revision older than one already accepted."""

    def __init__(self, revision: int, accepted: int, where: str) -> None:
        super().__init__(
            f"{where} served revision {revision}, older than revision {accepted} already "
            "accepted from it (a replayed or rolled-back response)",
            category=FailureCategory.DENIED,
            revision=revision,
        )

    @property
    def reason(self) -> str:
        return reasons.ROLLBACK


@dataclass(frozen=True)
class _Accepted:
    etag: str
    loaded: LoadedRevision


class FollowerStore:
    """ControlPlaneStore over an upstream replica's ``/v1/revision`` (module docstring)."""

    def __init__(
        self,
        config: ControlPlaneConfig,
        trusted_keys: list[str],
        *,
        max_schema_version: int,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        forward_to: str | None = None,
    ) -> None:
        self._url = config.url.rstrip("/")
        self._where = f"{self._url}{REVISION_PATH}"
        self._max_bytes = config.max_revision_bytes
        self._max_schema = max_schema_version
        self._trusted: dict[str, nacl.signing.VerifyKey] = parse_trusted(trusted_keys)
        headers = {"accept": "application/octet-stream"}
        if config.token_file is not None:
            # Read at every start of the convergence child (the store is made there).
            headers["authorization"] = f"Bearer {_read_token(config.token_file)}"
        self._client = httpx.AsyncClient(
            base_url=self._url, headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S),
            transport=transport,  # tests: an upstream served in-process
            verify=upstream_context(config) or True,
        )
        self._accepted: _Accepted | None = None
        self._highest = 0
        self._forward_to = forward_to

    def __repr__(self) -> str:
        return f"FollowerStore({self._url!r})"

    @property
    def identity(self) -> str:
        return f"upstream:{self._url}"

    # -- the protocol -------------------------------------------------------------

    async def desired(self) -> int | None:
        pointer = await self.observe()
        return None if pointer is None else pointer.revision

    async def observe(self) -> RevisionPointer | None:
        accepted = await self._fetch()
        if accepted is None:
            return None
        loaded = accepted.loaded
        return RevisionPointer(loaded.id, loaded.body_sha256, self.identity)

    async def hydrate(self) -> LoadedRevision | None:
        accepted = self._accepted
        if accepted is None:
            accepted = await self._fetch()
        return None if accepted is None else accepted.loaded

    async def publish(self, body: bytes, schema_version: int, message: str | None) -> int:
        raise ControlPlaneError(
            f"this replica follows {self._url} and has no control plane of its own: "
            "publish to the upstream's control plane",
            category=FailureCategory.INVALID,
        )

    async def migrate(self) -> Migrated:
        raise ControlPlaneError(
            f"this replica follows {self._url}: there is no schema to migrate here",
            category=FailureCategory.INVALID,
        )

    def _no_lifecycle(self, what: str) -> ControlPlaneError:
        return ControlPlaneError(
            f"this replica follows {self._url}: {what} runs against the upstream's control "
            "plane, not here",
            category=FailureCategory.INVALID,
        )

    async def history(self, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        raise self._no_lifecycle("history")

    async def revision(self, revision: int) -> LoadedRevision:
        raise self._no_lifecycle("show")

    async def rollback(self, revision: int, body_sha256: bytes,
                       message: str | None = None) -> int | None:
        raise self._no_lifecycle("rollback")

    async def prune(self, keep: int) -> list[int]:
        raise self._no_lifecycle("db prune")

    async def changes(self, limit: int | None) -> list[DesiredChange]:
        raise self._no_lifecycle("history")

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- one fetch -----------------------------------------------------------------

    async def _fetch(self) -> _Accepted | None:
        """GET the upstream's revision (conditionally); verify; remember it. None: nothing there."""
        held = self._accepted
        headers = {"if-none-match": held.etag} if held is not None else {}
        try:
            async with self._client.stream("GET", REVISION_PATH, headers=headers) as response:
                if response.status_code == 304 and held is not None:
                    return held
                if response.status_code != 200:
                    detail = (await response.aread())[:300].decode("utf-8", "replace")
                    raise self._status_error(response.status_code, detail)
                data = await self._read_bounded(response)
                etag = response.headers.get("etag", "")
        except httpx.HTTPError as exc:
            raise ControlPlaneError(
                f"upstream {self._where} unreachable: {type(exc).__name__}: {exc}",
                category=FailureCategory.UNAVAILABLE,
            ) from exc
        accepted = self._verify(data, etag)
        if self._forward_to is not None:
            await trio.to_thread.run_sync(self._forward, data)
        self._accepted = accepted
        self._highest = max(self._highest, accepted.loaded.id)
        return accepted

    def _forward(self, data: bytes) -> None:
        """Keep the verified bytes for this replica's own followers (blocking; atomic)."""
        assert self._forward_to is not None
        try:
            write_atomic(self._forward_to, data, mode=0o600)
        except OSError as exc:
            # Only this replica's followers lose: they keep polling and retry.
            log.warning("cannot keep the upstream's signed revision for this replica's "
                        "followers", path=self._forward_to, error=str(exc))

    async def _read_bounded(self, response: httpx.Response) -> bytes:
        limit = self._max_bytes + _FRAMING_BYTES
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise TooLarge(None, size, self._max_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    def _status_error(self, status: int, detail: str) -> ControlPlaneError:
        text = " ".join(detail.split())
        message = f"upstream {self._where} answered {status}: {text}"
        if status in (401, 403):
            return ControlPlaneError(message + " (check [control_plane].token_file)",
                                     category=FailureCategory.DENIED)
        if status >= 500:
            return ControlPlaneError(message, category=FailureCategory.UNAVAILABLE)
        return ControlPlaneError(message, category=FailureCategory.INVALID)

    def _verify(self, data: bytes, etag: str) -> _Accepted:
        """The checks of the module docstring, in its order; ControlPlaneError when refused."""
        try:
            header, body = decode_file(data, self._where, self._trusted)
        except CacheSkew as exc:
            raise ControlPlaneError(str(exc), category=FailureCategory.INVALID) from exc
        except CacheError as exc:
            category = (FailureCategory.DENIED if exc.reason == reasons.DENIED
                        else FailureCategory.CORRUPT)
            # Drop the revision of a denied response: nothing unauthenticated is believed.
            revision = exc.revision if category is FailureCategory.CORRUPT else None
            raise ControlPlaneError(str(exc), category=category, revision=revision) from exc
        if header.revision < 1:
            raise ControlPlaneError(f"{self._where}: signed revision {header.revision} is not "
                                    "a revision id", category=FailureCategory.CORRUPT)
        if header.revision < self._highest:
            raise RolledBack(header.revision, self._highest, self._where)
        if len(body) > self._max_bytes:
            raise TooLarge(header.revision, len(body), self._max_bytes)
        if header.schema_version > self._max_schema:
            raise Incompatible(header.revision, header.schema_version, self._max_schema)
        loaded = LoadedRevision(
            id=header.revision,
            schema_version=header.schema_version,
            body=body,
            created_at=header.created_at,
            message=None,
            body_sha256=hashlib.sha256(body).digest(),
        )
        return _Accepted(etag or f'"{header.revision}"', loaded)
