"""The database stores' statements, one set per dialect, and the store methods that run them.

The statements block and take a driver connection (:class:`pg`, :class:`sqlite`).
:class:`DatabaseStore` runs them through its runner, so they fail like any store call.
Their contracts are :class:`~supervisor.controlplane.store.RevisionAdmin`'s.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from supervisor.controlplane.checks import (
    as_bytes,
    bounded_message,
    check_hydrated,
    check_publishable,
    hydrate_sql,
    message_columns,
    observe_sql,
    parse_time,
    pointer_from_row,
)
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.controlplane.migrations import Backend, write_transaction
from supervisor.controlplane.runner import read_deadline_s
from supervisor.controlplane.store import (
    DesiredChange,
    LoadedRevision,
    RevisionPointer,
    RevisionSummary,
)
from supervisor.logs import get_logger
from supervisor.sinks.state import Candidate

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig
    from supervisor.controlplane.runner import ConnectionRunner

__all__ = ["DatabaseStore", "DesiredChange", "Dialect", "RevisionSummary", "attempt_deadline_s",
           "pg", "sqlite"]

log = get_logger("controlplane")

#: The change record's columns, newest first (both stores).
CHANGES_SQL = ("SELECT sequence, revision_id, changed_at, changed_by, message"
               " FROM supervisor_desired_log ORDER BY sequence DESC")
DESIRED_SQL = "SELECT revision_id FROM supervisor_desired WHERE singleton"


def _not_found(revision: int) -> ControlPlaneError:
    return ControlPlaneError(f"revision {revision} does not exist",
                             category=FailureCategory.NOT_FOUND, revision=revision)


def _desired(conn: Any) -> int | None:
    row = conn.execute(DESIRED_SQL).fetchone()
    if row is None:
        return None
    if not isinstance(row[0], int):
        raise TypeError(f"the desired pointer holds {row[0]!r}, not a revision id")
    return int(row[0])


class Dialect:
    """What the two databases spell differently; the statements both run are its methods.

    A subclass (:class:`pg`, :class:`sqlite`) sets the spellings and overrides the hooks.
    """

    BACKEND: Backend
    NAMED: str  # a named parameter, for ``str.format``
    P: str  # a positional parameter
    B: str  # a positional bytes parameter
    NOW: str
    LOCK: str  # what locks the desired row read ahead of a write
    IS_NOT: str  # NULL-safe inequality
    ALL: int | None  # LIMIT's "no limit"
    CREATED_AT: str

    @staticmethod
    def one(conn: Any, query: str, params: Any = ()) -> Any:
        return conn.execute(query, params).fetchone()

    size: Callable[[str], str]  # a column's size in bytes
    head: Callable[[str, int], str]  # a text column's first so many characters
    write: Callable[[Any], AbstractContextManager[object]]  # one write transaction

    @staticmethod
    def before(conn: Any, message: str | None) -> None:
        """Ahead of a change of the pointer (same transaction)."""

    @staticmethod
    def after(conn: Any, message: str | None) -> None:
        """After a change of the pointer (same transaction)."""

    @staticmethod
    def gone() -> tuple[type[BaseException], ...]:
        """The driver's errors for a revision pruned while a rollback re-pointed to it."""
        return ()

    @classmethod
    def upsert_desired(cls, select: str) -> str:
        return ("INSERT INTO supervisor_desired (singleton, revision_id) " + select
                + " ON CONFLICT (singleton) DO UPDATE"
                f" SET revision_id = excluded.revision_id, updated_at = {cls.NOW}")

    @classmethod
    def publish(cls, conn: Any, body: bytes, schema_version: int, message: str | None) -> int:
        with cls.write(conn):
            cls.before(conn, message)
            row = cls.one(
                conn, "INSERT INTO supervisor_revisions (schema_version, body, body_sha256,"
                f" message) VALUES ({cls.P}, {cls.B}, {cls.B}, {cls.P}) RETURNING id",
                [schema_version, body, hashlib.sha256(body).digest(), message])
            revision = int(row[0])  # INSERT ... RETURNING always returns the row
            # On PostgreSQL the trigger on supervisor_desired sends the NOTIFY, at commit.
            conn.execute(cls.upsert_desired(f"VALUES (TRUE, {cls.P})"), [revision])
            cls.after(conn, message)
        return revision

    @classmethod
    def history(cls, conn: Any, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        """One statement, so one snapshot: the pointer and the list agree (no body is read)."""
        rows = conn.execute(
            "SELECT (SELECT revision_id FROM supervisor_desired WHERE singleton),"
            f" r.id, r.schema_version, {cls.size('r.body')}, r.body_sha256, {cls.CREATED_AT},"
            f" {message_columns(cls.size, cls.head)} FROM (SELECT 1) one LEFT JOIN"
            f" (SELECT * FROM supervisor_revisions ORDER BY id DESC LIMIT {cls.P}) r ON TRUE"
            " ORDER BY r.id DESC", [cls.ALL if limit is None else limit]).fetchall()
        desired = rows[0][0] if rows and rows[0][0] is not None else None
        return None if desired is None else int(desired), [
            RevisionSummary(int(rid), int(sv), int(size), as_bytes(digest) or b"",
                            parse_time(created), bounded_message(head, length))
            for _, rid, sv, size, digest, created, head, length in rows if rid is not None]

    @classmethod
    def read_revision(cls, conn: Any, revision: int, max_bytes: int) -> LoadedRevision:
        measured = cls.size("r.body")
        row = cls.one(conn, f"SELECT r.id, r.schema_version, {measured},"
                      f" CASE WHEN {measured} <= {cls.P} THEN r.body END, r.body_sha256,"
                      f" {cls.CREATED_AT}, {message_columns(cls.size, cls.head)}"
                      f" FROM supervisor_revisions r WHERE r.id = {cls.P}",
                      [max_bytes, revision])
        if row is None:
            raise _not_found(revision)
        found = check_hydrated((revision, *row[:6], None), max_revision_bytes=max_bytes,
                               max_schema_version=sys.maxsize)
        created_at = parse_time(row[5])
        assert created_at is not None  # checked: a revision without one is corrupt
        return LoadedRevision(found.id, found.schema_version, found.body, created_at,
                              bounded_message(row[6], row[7]), found.body_sha256)

    @classmethod
    def rollback(cls, conn: Any, revision: int, body_sha256: bytes,
                 message: str | None = None) -> int | None:
        """Re-point desired; the id it replaced, read under the same lock."""
        try:
            with cls.write(conn):
                cls.before(conn, message)
                # Locked first, so "previous" is what this write replaces: a
                # publish committing meanwhile is waited for, and then read.
                old = conn.execute(DESIRED_SQL + cls.LOCK).fetchone()
                row = conn.execute(cls.upsert_desired(
                    "SELECT TRUE, id FROM supervisor_revisions"
                    f" WHERE id = {cls.P} AND body_sha256 = {cls.B}") + " RETURNING revision_id",
                    [revision, body_sha256]).fetchone()
                if row is None:
                    raise _not_found(revision)  # rolled back: nothing to change
                cls.after(conn, message)
        except cls.gone() as exc:
            # A prune committed between this statement's read of the revision and
            # its write of the pointer (it waited on the desired row the prune
            # held): the revision is gone, which is what the caller must hear.
            raise _not_found(revision) from exc
        return None if old is None else int(old[0])

    @classmethod
    def changes(cls, conn: Any, limit: int | None) -> list[DesiredChange]:
        rows = conn.execute(f"{CHANGES_SQL} LIMIT {cls.P}",
                            [cls.ALL if limit is None else limit]).fetchall()
        return [DesiredChange(int(q), int(r), parse_time(at), str(by), msg)
                for q, r, at, by, msg in rows]

    @classmethod
    def prune(cls, conn: Any, keep: int) -> list[int]:
        with cls.write(conn):
            row = conn.execute(DESIRED_SQL + cls.LOCK).fetchone()
            rows = conn.execute(
                "DELETE FROM supervisor_revisions WHERE id NOT IN"
                f" (SELECT id FROM supervisor_revisions ORDER BY id DESC LIMIT {cls.P})"
                f" AND id {cls.IS_NOT} {cls.P} RETURNING id",
                [keep, None if row is None else int(row[0])],
            ).fetchall()
        return sorted(int(r[0]) for r in rows)


class pg(Dialect):  # PostgreSQL's spellings
    BACKEND = "postgresql"
    NAMED, P, B, NOW, LOCK, IS_NOT, ALL = ("%({})s", "%s", "%b", "now()", " FOR UPDATE",
                                           "IS DISTINCT FROM", None)
    CREATED_AT = "r.created_at"

    @staticmethod
    def one(conn: Any, query: str, params: Any = None) -> Any:
        """One row, in binary format: bytea travels as raw bytes, not hex text twice the size."""
        with conn.cursor(binary=True) as cur:
            return cur.execute(query, params).fetchone()

    @staticmethod
    def size(column: str) -> str:
        return f"octet_length({column})"

    @staticmethod
    def head(column: str, chars: int) -> str:
        return f"left({column}, {int(chars)})"

    @staticmethod
    def write(conn: Any) -> AbstractContextManager[object]:
        return cast("AbstractContextManager[object]", conn.transaction())

    @staticmethod
    def before(conn: Any, message: str | None) -> None:
        """Hand the change's message to the recording trigger (this transaction only)."""
        conn.execute("SELECT set_config('supervisor.change_message', %s, true)", [message or ""])

    @staticmethod
    def gone() -> tuple[type[BaseException], ...]:
        import psycopg  # the PostgreSQL driver loads only where it is used

        return (psycopg.errors.ForeignKeyViolation,)


class sqlite(Dialect):  # SQLite's spellings
    BACKEND = "sqlite"
    NAMED, P, B, LOCK, IS_NOT, ALL = ":{}", "?", "?", "", "IS NOT", -1
    NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
    #: A time is TEXT here, which a plain-SQL writer may make of any length.
    CREATED_AT = "substr(r.created_at, 1, 64)"

    @staticmethod
    def size(column: str) -> str:
        """A BLOB's size in bytes. length() of a BLOB is answered from the record header
        without loading the value; TEXT (a plain-SQL publisher's string) counts
        characters, so it is measured as bytes instead."""
        return (f"CASE typeof({column}) WHEN 'blob' THEN length({column})"
                f" ELSE length(CAST({column} AS BLOB)) END")

    @staticmethod
    def head(column: str, chars: int) -> str:
        return f"substr({column}, 1, {int(chars)})"

    @staticmethod
    def write(conn: Any) -> AbstractContextManager[object]:
        return write_transaction(conn)

    @staticmethod
    def after(conn: Any, message: str | None) -> None:
        """Put who made the change just written, and why, on its record (same transaction).

        SQLite has no database role: the change is the OS user's.
        """
        conn.execute("UPDATE supervisor_desired_log SET changed_by = ?, message = ? WHERE sequence"
                     " = (SELECT sequence FROM supervisor_desired WHERE singleton)",
                     (_os_user(), message))


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (a bare container)
        return f"uid {os.getuid()}"


def attempt_deadline_s(config: ControlPlaneConfig) -> float:
    """The longest a convergence attempt may spend in a database store on its own deadlines.

    An attempt that reads a body makes three calls: observe, the body's size, and the
    hydrate (:meth:`DatabaseStore.hydrate`). Each of the first two may take
    ``read_timeout_s``, a connect and its setup included. The hydrate of the largest
    body allowed (``max_revision_bytes``) may take its grown deadline
    (:func:`~supervisor.controlplane.runner.read_deadline_s`).
    """
    read_s = config.read_timeout_s
    return 2 * read_s + read_deadline_s(read_s, config.max_revision_bytes,
                                        config.min_read_rate_kib_s)


class DatabaseStore:
    """The RevisionAdmin methods both databases implement alike.

    A subclass sets ``_sql`` (:class:`pg` or :class:`sqlite`) and ``_runner``, and
    implements ``migrate``. It is its runner's
    :class:`~supervisor.controlplane.runner.Driver` too: it opens, sets up, calls and
    closes the connections, and learns ``identity`` when it opens one.
    """

    _sql: type[Dialect]
    _runner: ConnectionRunner[Any]
    #: Which database the last connection reached (None before the first call).
    identity: str | None = None
    #: Whether this store's role may read the migrations table (learnt at connect).
    _schema_readable = True

    def __init__(self, config: ControlPlaneConfig, max_schema_version: int) -> None:
        self._max_bytes = config.max_revision_bytes
        self._max_schema = max_schema_version
        self._min_read_rate_kib_s = config.min_read_rate_kib_s

    async def desired(self) -> int | None:
        return await self._runner.run("read", _desired)

    async def observe(self) -> RevisionPointer | None:
        def read(conn: Any) -> RevisionPointer | None:
            row = self._sql.one(conn, observe_sql(self._schema_readable))
            return pointer_from_row(row, self.identity, self._sql.BACKEND)

        return await self._runner.run("read", read)

    async def hydrate(self) -> Candidate | None:
        sql, max_bytes, max_schema = self._sql, self._max_bytes, self._max_schema
        query = hydrate_sql(sql.size, sql.NAMED, sql.CREATED_AT)

        def read(conn: Any) -> Candidate | None:
            row = sql.one(conn, query, {"max_bytes": max_bytes, "max_schema": max_schema})
            if row is None:
                return None
            return check_hydrated(row, max_revision_bytes=max_bytes, max_schema_version=max_schema)

        # The body's size first (answered from the row's header): its read's deadline grows with it.
        found = await self._runner.run("read", partial(sql.one, query=(
            f"SELECT r.id, {sql.size('r.body')} FROM supervisor_desired d"
            " JOIN supervisor_revisions r ON r.id = d.revision_id WHERE d.singleton")))
        if found is None or found[1] is None or found[1] > max_bytes:
            return await self._runner.run("hydrate", read)
        body = (int(found[0]), int(found[1]))
        return await self._runner.run("hydrate", read, body=body, deadline_s=read_deadline_s(
            self._runner.deadline_s, body[1], self._min_read_rate_kib_s))

    async def publish(self, body: bytes, schema_version: int, message: str | None) -> int:
        check_publishable(body, schema_version, max_revision_bytes=self._max_bytes,
                          max_schema_version=self._max_schema)
        revision = await self._runner.run("publish", partial(
            self._sql.publish, body=body, schema_version=schema_version, message=message))
        log.info("revision published", revision=revision, bytes=len(body))
        return revision

    async def history(self, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        return await self._runner.run("history", partial(self._sql.history, limit=limit))

    async def revision(self, revision: int) -> LoadedRevision:
        return await self._runner.run("read", partial(
            self._sql.read_revision, revision=revision, max_bytes=self._max_bytes))

    async def rollback(self, revision: int, body_sha256: bytes,
                       message: str | None = None) -> int | None:
        previous = await self._runner.run("rollback", partial(
            self._sql.rollback, revision=revision, body_sha256=body_sha256, message=message))
        log.info("desired revision rolled back", revision=revision, previous=previous)
        return previous

    async def prune(self, keep: int) -> list[int]:
        return await self._runner.run("prune", partial(self._sql.prune, keep=keep))

    async def changes(self, limit: int | None) -> list[DesiredChange]:
        return await self._runner.run("history", partial(self._sql.changes, limit=limit))

    async def aclose(self) -> None:
        await self._runner.aclose()
