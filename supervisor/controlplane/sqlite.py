"""The embedded SQLite control-plane store: the PostgreSQL store's semantics, one file.

Same tables (docs/control-plane.md, minus the NOTIFY trigger: replicas on
SQLite converge by polling alone), same hydration checks
(:func:`~supervisor.controlplane.store.check_hydrated`), same failure
categories. The schema is migrated when the connection is first opened (an
embedded store has no separate operator step; an up-to-date file is only read).

Driving: the stdlib ``sqlite3`` module, one connection
(``check_same_thread=False``) used from worker threads one call at a time
under a ``CapacityLimiter(1)``. A cancelled call (shutdown, or the client-side
deadline) calls ``Connection.interrupt()``, the thread-safe SQLite analogue
of PostgreSQL's cancel, and the connection is replaced. SQLite's own busy
wait ignores interrupt(), so the store waits for locks itself (busy timeout
0, re-running the statement with backoff up to half the statement timeout)
and stops waiting as soon as the call is cancelled.
``isolation_level=None``: transactions are explicit, so a read never leaves
one open; ``BEGIN IMMEDIATE`` for writes takes the write lock up front, so two
writers queue (for up to the busy timeout) instead of deadlocking on upgrade.

Error mapping: :mod:`supervisor.controlplane.sqlite_driver`.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import trio

from supervisor.config import sqlite_path
from supervisor.controlplane import migrations, revisions
from supervisor.controlplane.checks import (
    OBSERVE_SQL,
    HydrateRow,
    check_hydrated,
    check_publishable,
    pointer_from_row,
)
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.controlplane.runner import ConnectionRunner
from supervisor.controlplane.sqlite_driver import SQLiteConnections, map_error
from supervisor.controlplane.store import LoadedRevision, RevisionPointer
from supervisor.logs import get_logger

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig
    from supervisor.controlplane.revisions import DesiredChange, RevisionSummary

__all__ = ["SQLiteStore"]

log = get_logger("controlplane")

T = TypeVar("T")

_NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
# The body's size in bytes. length() of a BLOB column is answered from the
# record header without loading the value; TEXT (a plain-SQL publisher's
# string) counts characters, so it is measured as bytes instead.
_SIZE = (
    "CASE typeof(r.body) WHEN 'blob' THEN length(r.body)"
    " ELSE length(CAST(r.body AS BLOB)) END"
)

def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _as_bytes(value: object) -> bytes | None:
    # A plain-SQL publisher may have stored TEXT rather than a BLOB.
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return None


def _file_id(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of ``path``; None when it does not exist. Raises other OSError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _remove_stale_wal(path: str) -> None:
    for suffix in ("-wal", "-shm"):
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass


class SQLiteStore:
    """ControlPlaneStore on an SQLite file (see the module docstring)."""

    def __init__(
        self,
        config: ControlPlaneConfig,
        *,
        max_schema_version: int,
        statement_timeout_s: float = 10.0,
        create: bool = True,
    ) -> None:
        self._path = sqlite_path(config.url)
        self._create = create
        self._wal_id: tuple[int, int] | None = None
        self._max_bytes = config.max_revision_bytes
        self._max_schema = max_schema_version
        # Lock contention should surface as SQLITE_BUSY (CONFLICT, which names
        # the problem) well before the client-side deadline cancels the call.
        self._connections = SQLiteConnections(self._path, create, statement_timeout_s / 2)
        self._runner = ConnectionRunner(self._connections, deadline_s=statement_timeout_s + 1.0,
                                        before=self._check_file)
        self._run = self._runner.run

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    # -- the protocol -------------------------------------------------------------

    async def desired(self) -> int | None:
        def read(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "SELECT revision_id FROM supervisor_desired WHERE singleton"
            ).fetchone()
            if row is None:
                return None
            if not isinstance(row[0], int):
                raise TypeError(f"the desired pointer holds {row[0]!r}, not a revision id")
            return int(row[0])

        return await self._run("read", read)

    async def observe(self) -> RevisionPointer | None:
        def read(conn: sqlite3.Connection) -> RevisionPointer | None:
            return pointer_from_row(conn.execute(OBSERVE_SQL).fetchone(), self.identity)

        return await self._run("read", read)

    @property
    def identity(self) -> str | None:
        """``sqlite:<device>:<inode>`` of the open file (None before the first call)."""
        file_id = self._connections.file_id
        if file_id is None:
            return None
        return f"sqlite:{file_id[0]}:{file_id[1]}"

    async def hydrate(self) -> LoadedRevision | None:
        max_bytes, max_schema = self._max_bytes, self._max_schema

        def read(conn: sqlite3.Connection) -> LoadedRevision | None:
            # One SELECT runs in one read transaction: a consistent pair. The
            # body is withheld in SQL when too large or too new.
            row = conn.execute(
                "SELECT d.revision_id, r.id, r.schema_version, "
                f"{_SIZE}, CASE WHEN {_SIZE} <= :max_bytes"
                " AND r.schema_version <= :max_schema THEN r.body END,"
                " r.body_sha256, r.created_at, r.message, d.sequence"
                " FROM supervisor_desired d"
                " LEFT JOIN supervisor_revisions r ON r.id = d.revision_id"
                " WHERE d.singleton",
                {"max_bytes": max_bytes, "max_schema": max_schema},
            ).fetchone()
            if row is None:
                return None
            desired, rid, schema_version, size, body, digest, created_at, message, seq = row
            return check_hydrated(
                HydrateRow(
                    desired=desired if isinstance(desired, int) else None,
                    id=rid,
                    schema_version=schema_version,
                    size=size,
                    body=_as_bytes(body),
                    body_sha256=_as_bytes(digest),
                    created_at=_parse_time(created_at),
                    message=message,
                    sequence=seq,
                ),
                max_revision_bytes=max_bytes,
                max_schema_version=max_schema,
            )

        return await self._run("hydrate", read)

    async def publish(self, body: bytes, schema_version: int, message: str | None) -> int:
        check_publishable(
            body, schema_version,
            max_revision_bytes=self._max_bytes, max_schema_version=self._max_schema,
        )

        def write(conn: sqlite3.Connection) -> int:
            digest = hashlib.sha256(body).digest()
            with migrations.write_transaction(conn):
                cur = conn.execute(
                    "INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)"
                    " VALUES (?, ?, ?, ?)",
                    (schema_version, body, digest, message),
                )
                revision = cur.lastrowid
                assert revision is not None  # set by every successful INSERT
                conn.execute(
                    "INSERT INTO supervisor_desired (singleton, revision_id) VALUES (TRUE, ?)"
                    " ON CONFLICT (singleton) DO UPDATE"
                    f" SET revision_id = excluded.revision_id, updated_at = {_NOW}",
                    (revision,),
                )
                revisions.sqlite.say_who_and_why(conn, message)
            return revision

        revision = await self._run("publish", write)
        log.info("revision published", revision=revision, bytes=len(body))
        return revision

    async def migrate(self) -> migrations.Migrated:
        # Opening the connection migrates; this makes sure one is open (and
        # migrates again, harmlessly, in case the file was replaced meanwhile).
        # What the open did counts: a new file is created there, not here.
        done = await self._run("migrate", migrations.migrate_sqlite)
        opened = self._connections.take_migrated()
        if opened is not None:
            done = migrations.Migrated(opened.before, done.after)
        log.info("control-plane schema migrated" if done.before < done.after
                 else "control-plane schema up to date",
                 before=done.before, version=done.after, path=self._path)
        return done

    # -- the revision lifecycle (statements in controlplane.revisions) --

    async def history(self, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        return await self._run("history", partial(revisions.sqlite.history, limit=limit,
                                                  as_bytes=_as_bytes, parse_time=_parse_time))

    async def revision(self, revision: int) -> LoadedRevision:
        return await self._run("read", partial(
            revisions.sqlite.read_revision, revision=revision, max_bytes=self._max_bytes,
            as_bytes=_as_bytes, parse_time=_parse_time))

    async def rollback(self, revision: int, body_sha256: bytes,
                       message: str | None = None) -> int | None:
        previous: int | None = await self._run("rollback", partial(
            revisions.sqlite.rollback, revision=revision, body_sha256=body_sha256, now=_NOW,
            message=message))
        log.info("desired revision rolled back", revision=revision, previous=previous)
        return previous

    async def prune(self, keep: int) -> list[int]:
        return await self._run("prune", partial(revisions.sqlite.prune, keep=keep))

    async def changes(self, limit: int | None) -> list[DesiredChange]:
        return await self._run("history", partial(revisions.sqlite.changes, limit=limit,
                                                  parse_time=_parse_time))

    async def aclose(self) -> None:
        await self._runner.aclose()

    # -- before every call ---------------------------------------------------------

    async def _check_file(self, what: str) -> None:
        try:
            await self._still_same_file()
        except OSError as exc:
            raise map_error(exc, what=what) from exc

    async def _still_same_file(self) -> None:
        """Drop the connection when the path no longer names the file it reads.

        Raises the ``unavailable`` error when the file is gone (the daemon does
        not create one: a vanished control plane is an outage, not an empty one).

        A replaced file may have the *previous* file's ``-wal`` and ``-shm``
        next to it, left by another process that still has the old file open
        (an operator's shell, a CLI command): opening the new file would replay
        the old file's WAL over it and silently undo the restore. The WAL's
        inode is recorded while the file is unchanged; after a replacement a WAL
        with that same inode belongs to the old file (whose name is gone, so
        nobody can open it again) and is removed with its shared-memory index.
        """
        conn = self._runner.connection
        path = self._path
        current = await trio.to_thread.run_sync(_file_id, path)
        wal = await trio.to_thread.run_sync(_file_id, path + "-wal")
        # The file last opened, kept after its connection was dropped: a restore
        # may come in two steps (the file moved away, an outage, then the new
        # one moved in), and the new file must be checked against the old WAL
        # then too, not only when a connection was open at the replacement.
        known = self._connections.file_id
        if known is not None and current != known:
            if conn is not None:
                log.warning(
                    "control-plane file replaced or removed; reopening"
                    if current is not None else "control-plane file removed",
                    path=path,
                )
                await self._runner.discard()
            if current is not None:
                if wal is not None and wal == self._wal_id:
                    await trio.to_thread.run_sync(_remove_stale_wal, path)
                    log.warning("removed the replaced control-plane file's WAL (another "
                                "process still had the old file open); the new file is read "
                                "as restored", path=path)
                # Kept while the file is missing: the old WAL's inode is what
                # the file that comes back is checked against.
                self._wal_id = None
        elif conn is not None:
            if self._wal_id is not None and wal != self._wal_id:
                # Our connection still reads the WAL that had that name (now
                # unlinked): publishes go to a new one it never sees.
                log.warning("control-plane WAL file removed or replaced under the daemon; "
                            "reopening", path=path)
                await self._runner.discard()
                wal = None
            self._wal_id = wal
        if current is None and not self._create:
            raise ControlPlaneError(
                f"control plane read failed: the control-plane file {path} does not exist"
                " (`trio-supervisor publish FILE` or `trio-supervisor db migrate` with"
                " this configuration creates it)",
                category=FailureCategory.UNAVAILABLE,
            )
