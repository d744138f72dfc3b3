"""The control-plane store: what the convergence loop reads, and how it fails.

Contract (CONTRACT.md section 4): the control plane holds immutable revisions
(``supervisor_revisions``) and one pointer to the desired one
(``supervisor_desired``). A store offers exactly the reads the convergence loop
needs (:meth:`ControlPlaneStore.desired`, the cheap liveness-proving read, and
:meth:`ControlPlaneStore.hydrate`, one consistent read of the complete desired
revision), :meth:`~ControlPlaneStore.publish` for the CLI, and
:meth:`~ControlPlaneStore.migrate`. Three implementations exist:
:mod:`supervisor.controlplane.postgres`, :mod:`supervisor.controlplane.sqlite`
and, in follower mode, :mod:`supervisor.controlplane.follower` (another
replica's signed ``/v1/revision``; it refuses ``publish`` and ``migrate``);
:func:`open_store` picks one from the URL and never connects by itself (the
first call does, and a failed connection is re-made on the next call).

Every failure leaves a store as a :class:`ControlPlaneError` carrying a
:class:`FailureCategory`, chained (``raise ... from``) to the driver's error,
so callers classify without knowing the driver::

    SupervisorError                      (supervisor.errors)
    └── ControlPlaneError                .category, .revision, .reason, .retryable
        ├── Incompatible                 schema_version newer than this build reads
        │                                (category DENIED, reason "incompatible")
        └── TooLarge                     body over max_revision_bytes
                                         (category DENIED, reason "denied")

    category     reason        retryable  raised for
    UNAVAILABLE  unavailable   yes        connection failure, timeout, cancelled statement
    CONFLICT     conflict      yes        serialization failure, deadlock, lock contention
    NOT_FOUND    not_found     no         desired points at a missing revision
    INVALID      invalid       no         schema not migrated, malformed request or URL
    DENIED       denied        no         privileges; body too large; (Incompatible)
    CORRUPT      corrupt       no         body digest mismatch; damaged storage (PostgreSQL
                                          SQLSTATE class XX, SQLite CORRUPT/NOTADB)

A refusal about a specific revision (NOT_FOUND, CORRUPT, Incompatible,
TooLarge) names it in ``.revision``; connection-level failures leave it None.

Hydration checks, in this order, all before the body is decoded: the pointer
names a missing revision (NOT_FOUND); the body is larger than
``max_revision_bytes`` (TooLarge); its ``schema_version`` is newer than the
build reads (Incompatible); its SHA-256 differs from ``body_sha256`` (CORRUPT).
The query itself withholds the body in the first three cases, so an oversize
or unreadable body never crosses the network. The body is returned as bytes,
undecoded: decoding is the revision compiler's job. Both stores run the same
:func:`check_hydrated` and :func:`check_publishable`, so they cannot drift.

The module also holds the one piece of machinery both implementations share,
:func:`call_interruptibly`: blocking driver calls run in worker threads that
trio may abandon, and a cancelled call is interrupted on the server side and
its connection replaced. A cancelled ``publish`` has an unknown outcome (the
commit may have won the race), like any write whose answer never arrived.
"""

from __future__ import annotations

import enum
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import trio

from supervisor import reasons
from supervisor.errors import SupervisorError
from supervisor.logs import get_logger

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig
    from supervisor.controlplane.revisions import RevisionSummary

__all__ = [
    "OBSERVE_SQL",
    "ControlPlaneError",
    "ControlPlaneStore",
    "FailureCategory",
    "Incompatible",
    "LoadedRevision",
    "RevisionPointer",
    "TooLarge",
    "malformed",
    "open_store",
    "pointer_from_row",
]

log = get_logger("controlplane")

T = TypeVar("T")

#: How long a cancelled call may spend interrupting its statement. Cleanup runs
#: shielded, and a shield without a deadline can hang a shutdown.
INTERRUPT_GRACE_S = 2.0

MIGRATE_HINT = "the control-plane schema is missing or outdated: run `trio-supervisor db migrate`"


class FailureCategory(enum.Enum):
    """What kind of failure a store reports; decides retry and reason label."""

    UNAVAILABLE = "unavailable"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    INVALID = "invalid"
    DENIED = "denied"
    CORRUPT = "corrupt"


# Exhaustive on purpose: a new category without a catalogued label fails here,
# at import, rather than emitting a label the metrics never pre-initialised.
_REASONS: dict[FailureCategory, str] = {
    FailureCategory.UNAVAILABLE: reasons.UNAVAILABLE,
    FailureCategory.CONFLICT: reasons.CONFLICT,
    FailureCategory.NOT_FOUND: reasons.NOT_FOUND,
    FailureCategory.INVALID: reasons.INVALID,
    FailureCategory.DENIED: reasons.DENIED,
    FailureCategory.CORRUPT: reasons.CORRUPT,
}
assert set(_REASONS) == set(FailureCategory)

_RETRYABLE = frozenset({FailureCategory.UNAVAILABLE, FailureCategory.CONFLICT})


class ControlPlaneError(SupervisorError):
    """A store operation failed; see the module docstring for the hierarchy.

    The message never contains the DSN's password (stores scrub driver
    messages before wrapping them).
    """

    def __init__(
        self, message: str, *, category: FailureCategory, revision: int | None = None
    ) -> None:
        super().__init__(message)
        self.category = category
        self.revision = revision

    @property
    def reason(self) -> str:
        """The low-cardinality label (:mod:`supervisor.reasons`) for metrics and status."""
        return _REASONS[self.category]

    @property
    def retryable(self) -> bool:
        """True when trying again later may succeed without anyone repairing anything."""
        return self.category in _RETRYABLE

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self)!r}, category={self.category.name}, "
            f"revision={self.revision})"
        )


class Incompatible(ControlPlaneError):
    """The desired revision's ``schema_version`` is newer than this build reads.

    Storage is intact; the fix is deploying a newer build, so the reason label
    is ``incompatible`` rather than the category's ``denied``.
    """

    def __init__(
        self, revision: int | None, schema_version: int, max_schema_version: int
    ) -> None:
        which = f"revision {revision}" if revision is not None else "the revision"
        super().__init__(
            f"{which} has schema_version {schema_version}; "
            f"this build reads up to {max_schema_version}",
            category=FailureCategory.DENIED,
            revision=revision,
        )
        self.schema_version = schema_version
        self.max_schema_version = max_schema_version

    @property
    def reason(self) -> str:
        return reasons.INCOMPATIBLE


class TooLarge(ControlPlaneError):
    """A revision body is larger than ``max_revision_bytes`` (a bound, so DENIED)."""

    def __init__(self, revision: int | None, size: int, limit: int) -> None:
        which = f"revision {revision}" if revision is not None else "the revision"
        super().__init__(
            f"{which} is {size} bytes, over max_revision_bytes ({limit})",
            category=FailureCategory.DENIED,
            revision=revision,
        )
        self.size = size
        self.limit = limit


@dataclass(frozen=True)
class LoadedRevision:
    """A complete revision as stored: the body is verified against its digest, not decoded.

    ``body_sha256`` is part of the revision's identity: after a restore from a
    backup an id may be reused for another body, so "the same revision" means
    the same id *and* the same digest.
    """

    id: int
    schema_version: int
    body: bytes = field(repr=False)
    created_at: datetime
    message: str | None
    body_sha256: bytes = b""


@dataclass(frozen=True)
class RevisionPointer:
    """What the cheap observe read learns: the desired revision and who said so.

    ``body_sha256`` is None when the pointer names a missing revision.
    ``identity`` names the control plane itself (PostgreSQL: system identifier
    and database oid; SQLite: the file's device and inode); a change means a
    restore or another database, and starts a new epoch in the loop.
    """

    revision: int
    body_sha256: bytes | None
    identity: str | None = None


class ControlPlaneStore(Protocol):
    """What the daemon and the CLI need from a control plane. Raises ControlPlaneError."""

    async def desired(self) -> int | None:
        """The desired revision id, or None when nothing was ever published.

        The cheap read the loop makes every poll; its success is what proves
        the control plane reachable.
        """
        ...

    async def observe(self) -> RevisionPointer | None:
        """The desired revision's id, body digest and the control plane's identity.

        As cheap as :meth:`desired` (one indexed join, 32 bytes more), and what
        the loop polls: an id alone cannot tell a reused id from the revision
        it replaced.
        """
        ...

    async def hydrate(self) -> LoadedRevision | None:
        """One consistent read of the desired pointer and the revision it names.

        None when nothing is desired. Raises NOT_FOUND, TooLarge, Incompatible
        or CORRUPT (in that order of checks) about the revision it read.
        """
        ...

    async def publish(self, body: bytes, schema_version: int, message: str | None) -> int:
        """Store a revision and make it desired in one transaction; return its id.

        The digest is computed here. Refuses (nothing stored) a body over
        ``max_revision_bytes`` (TooLarge) and a ``schema_version`` this build
        does not read (Incompatible), since no replica of it could load them.
        """
        ...

    async def migrate(self) -> None:
        """Create or upgrade the schema; versioned and idempotent."""
        ...

    # -- the revision lifecycle (issue 15; statements in controlplane.revisions) --

    async def history(self, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        """(desired id, the newest ``limit`` revisions newest first, without bodies)."""
        ...

    async def revision(self, revision: int) -> LoadedRevision:
        """One revision, its body checked against its digest; NOT_FOUND, TooLarge, CORRUPT.

        ``schema_version`` is returned as stored: the caller decides what it reads.
        """
        ...

    async def rollback(self, revision: int, body_sha256: bytes) -> None:
        """Point desired at ``revision`` if it still exists with this digest (else NOT_FOUND)."""
        ...

    async def prune(self, keep: int) -> list[int]:
        """Delete revisions older than the newest ``keep``, never the desired one; their ids."""
        ...

    async def aclose(self) -> None:
        """Close the connection; the store may not be used afterwards."""
        ...


def open_store(
    config: ControlPlaneConfig,
    *,
    max_schema_version: int,
    statement_timeout_s: float = 10.0,
    create: bool = True,
    trusted_keys: Sequence[str] = (),
    forward_to: str | None = None,
) -> ControlPlaneStore:
    """The store for ``config.url`` (PostgreSQL, SQLite, an upstream replica); not connected yet.

    ``trusted_keys`` (``[cache].trusted_keys``) is what a follower verifies the
    upstream's revisions against (:mod:`supervisor.controlplane.follower`);
    ``forward_to`` is where it keeps the upstream's signed bytes for its own
    followers. Both are unused by the databases.

    ``create=False`` (the daemon) never creates an SQLite file: a control-plane
    file that vanished is an outage to report, not an empty control plane.
    """
    if config.backend == "follower":
        from supervisor.controlplane.follower import FollowerStore

        return FollowerStore(
            config, list(trusted_keys), max_schema_version=max_schema_version,
            timeout_s=statement_timeout_s, forward_to=forward_to,
        )
    if config.backend == "sqlite":
        from supervisor.controlplane.sqlite import SQLiteStore

        return SQLiteStore(
            config, max_schema_version=max_schema_version,
            statement_timeout_s=statement_timeout_s, create=create,
        )
    from supervisor.controlplane.postgres import PostgresStore

    return PostgresStore(
        config, max_schema_version=max_schema_version, statement_timeout_s=statement_timeout_s
    )


# -- shared machinery for the implementations ------------------------------------


class _Call(Generic[T]):
    """One blocking call in a worker thread, which the trio side may give up on.

    When the trio side gives up while the call still runs, the resource the
    call uses cannot be closed from trio (the driver is mid-call on it), so the
    disposal is handed to the worker thread, which runs it when the call
    finally returns. The lock makes "still running?" and "hand over" atomic.
    """

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._done = False
        self._dispose: Callable[[], object] | None = None

    def run(self) -> T:
        try:
            return self._fn()
        finally:
            with self._lock:
                self._done = True
                dispose = self._dispose
            if dispose is not None:
                _dispose_quietly(dispose)

    def give_up(self, dispose: Callable[[], object]) -> None:
        """Dispose now (in a background thread) if finished, else when the call returns."""
        with self._lock:
            if not self._done:
                self._dispose = dispose
                return
        # Closing a connection can block on the network: never in the trio thread.
        trio.lowlevel.start_thread_soon(lambda: _dispose_quietly(dispose), lambda _: None)


def _dispose_quietly(dispose: Callable[[], object]) -> None:
    # Runs in a worker thread where nobody could handle an error: the resource
    # is being thrown away, so a failure to close it cleanly only matters as a log line.
    try:
        dispose()
    except Exception as exc:  # noqa: BLE001
        log.debug("closing an abandoned connection failed", error=str(exc))


async def call_interruptibly(
    fn: Callable[[], T],
    *,
    interrupt: Callable[[], object],
    dispose: Callable[[], object],
    grace_s: float = INTERRUPT_GRACE_S,
) -> T:
    """Run blocking ``fn`` in a worker thread; return its result or raise its error.

    On cancellation, trio abandons the thread at once, and then, shielded and
    for at most ``grace_s``, ``interrupt()`` runs in another thread (it asks the
    server to stop the statement: ``cancel_safe`` / ``sqlite3.interrupt``), so
    a hung query does not keep holding locks on the server. The connection is
    then thrown away: ``dispose()`` runs as soon as ``fn`` has returned, in a
    worker thread. The caller must forget the connection when this raises
    Cancelled and make a new one for the next call.
    """
    call = _Call(fn)
    try:
        return await trio.to_thread.run_sync(call.run, abandon_on_cancel=True)
    except trio.Cancelled:
        with trio.move_on_after(grace_s, shield=True):
            try:
                await trio.to_thread.run_sync(interrupt, abandon_on_cancel=True)
            except Exception as exc:  # noqa: BLE001 - best effort; the connection is discarded anyway
                log.debug("interrupting a cancelled statement failed", error=str(exc))
        call.give_up(dispose)
        raise


@dataclass(frozen=True)
class HydrateRow:
    """What a store's hydrate query returns, before any check.

    ``body`` is None when the query withheld it (too large or too new): the
    checks below refuse those rows before they look at the body.
    """

    desired: int | None
    id: int | None
    schema_version: int | None
    size: int | None
    body: bytes | None
    body_sha256: bytes | None
    created_at: datetime | None
    message: str | None


#: The observe read, identical on both stores: the pointer and its body's digest.
OBSERVE_SQL = (
    "SELECT d.revision_id, r.body_sha256 FROM supervisor_desired d"
    " LEFT JOIN supervisor_revisions r ON r.id = d.revision_id"
    " WHERE d.singleton"
)


def pointer_from_row(
    row: tuple[object, object] | None, identity: str | None
) -> RevisionPointer | None:
    """The observe row as a pointer; TypeError (-> ``malformed``) for an impossible pointer."""
    if row is None:
        return None
    revision, digest = row
    if not isinstance(revision, int) or revision < 1:
        raise TypeError(f"the desired pointer holds {revision!r}, not a revision id "
                        "(ids are >= 1)")
    if isinstance(digest, str):  # a plain-SQL publisher on SQLite may store TEXT
        digest = digest.encode("utf-8")
    if digest is not None and not isinstance(digest, bytes | bytearray | memoryview):
        raise TypeError(f"body_sha256 holds {type(digest).__name__}, not bytes")
    return RevisionPointer(revision, None if digest is None else bytes(digest), identity)


def malformed(exc: Exception, *, what: str) -> ControlPlaneError:
    """A driver call that failed with something no driver error explains.

    A row the code cannot read (a NULL where the schema promises a value, a
    type the column should not hold) surfaces as TypeError or ValueError from
    our own decoding: storage holds something the contract does not allow, so
    it is ``corrupt``, reported like any refusal instead of crashing the loop.
    The traceback is dropped: its frames hold the rows (possibly a whole body).
    """
    detail = " ".join(str(exc).split()) or "no detail"
    return ControlPlaneError(
        f"control plane {what} returned data this build cannot read "
        f"({type(exc).__name__}: {detail})",
        category=FailureCategory.CORRUPT,
    )


def check_hydrated(
    row: HydrateRow, *, max_revision_bytes: int, max_schema_version: int
) -> LoadedRevision:
    """Apply the hydration checks in the contract's order; blocking (hashes the body).

    Shared by both stores so they cannot drift apart in what they refuse or in which order.
    """
    if not isinstance(row.desired, int) or row.desired < 1:
        # The schema says NOT NULL, and identity columns start at 1; only a
        # hand-edited table gets here.
        raise ControlPlaneError(
            f"the desired pointer holds {row.desired!r}, not a revision id (ids are >= 1)",
            category=FailureCategory.CORRUPT,
        )
    if row.id is None:
        raise ControlPlaneError(
            f"desired points at revision {row.desired}, which does not exist",
            category=FailureCategory.NOT_FOUND,
            revision=row.desired,
        )
    size = row.size if row.size is not None else 0
    if size > max_revision_bytes:
        raise TooLarge(row.id, size, max_revision_bytes)
    schema_version = row.schema_version if row.schema_version is not None else 0
    if schema_version > max_schema_version:
        raise Incompatible(row.id, schema_version, max_schema_version)
    if row.body is None or row.created_at is None or schema_version < 1:
        raise ControlPlaneError(
            f"revision {row.id} is incomplete (missing body, created_at or schema_version)",
            category=FailureCategory.CORRUPT,
            revision=row.id,
        )
    if row.body_sha256 is None or hashlib.sha256(row.body).digest() != bytes(row.body_sha256):
        raise ControlPlaneError(
            f"revision {row.id}: body does not match body_sha256",
            category=FailureCategory.CORRUPT,
            revision=row.id,
        )
    return LoadedRevision(
        id=row.id,
        schema_version=schema_version,
        body=bytes(row.body),
        created_at=row.created_at,
        message=row.message,
        body_sha256=bytes(row.body_sha256),
    )


def check_publishable(
    body: bytes, schema_version: int, *, max_revision_bytes: int, max_schema_version: int
) -> None:
    """Refuse, before anything is stored, what no replica of this build could hydrate."""
    if len(body) > max_revision_bytes:
        raise TooLarge(None, len(body), max_revision_bytes)
    if schema_version > max_schema_version:
        raise Incompatible(None, schema_version, max_schema_version)
    if schema_version < 1:
        raise ControlPlaneError(
            f"schema_version must be >= 1, got {schema_version}",
            category=FailureCategory.INVALID,
        )


def unavailable_timeout(what: str, timeout_s: float) -> ControlPlaneError:
    """The error for an operation that ran out of its client-side deadline."""
    return ControlPlaneError(
        f"control plane {what} timed out after {timeout_s:g} s",
        category=FailureCategory.UNAVAILABLE,
    )
