"""Versioned, idempotent schema migrations for both control-plane backends (``db migrate``).

The SQL files, ``migrations/NNNN_name.<backend>.sql``, ship as package data.
``supervisor_schema_migrations`` records what ran. Each pending one runs once, in order,
in its record's transaction: a failure leaves nothing behind. A schema a newer build
migrated is refused before any change (SchemaTooNew). All of it blocks (worker threads).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from supervisor.controlplane.errors import ControlPlaneError, FailureCategory, SchemaTooNew

if TYPE_CHECKING:
    import psycopg

__all__ = ["MIGRATIONS_TABLE", "Migrated", "Migration", "check_not_newer", "latest_version",
           "load_migrations", "migrate_postgres", "migrate_sqlite", "postgres_version",
           "sqlite_version", "write_transaction"]

Backend = Literal["postgresql", "sqlite"]

MIGRATIONS_TABLE = "supervisor_schema_migrations"
TRIGGER_NAME = "supervisor_desired_notify"
# Arbitrary but fixed: the key every replica's migration run locks on
# (the bytes of "tsupmigr" as a signed 64-bit integer).
ADVISORY_LOCK_KEY = int.from_bytes(b"tsupmigr", "big", signed=True)

_FILE = re.compile(
    r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.(?P<backend>postgresql|sqlite)\.sql$"
)
_CHANNEL = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@cache
def load_migrations(backend: Backend) -> tuple[Migration, ...]:
    """The backend's migrations, ordered by version (read from package data once)."""
    found: list[Migration] = []
    folder = resources.files("supervisor.controlplane").joinpath("migrations")
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match is None or match["backend"] != backend:
            continue
        found.append(Migration(int(match["version"]), match["name"],
                               entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions) or not found:
        raise RuntimeError(f"broken {backend} migration set: versions {versions}")
    return tuple(found)


def latest_version(backend: Backend) -> int:
    return load_migrations(backend)[-1].version


@dataclass(frozen=True)
class Migrated:
    """What one migration run did: the schema version before it (0: none) and after."""

    before: int
    after: int

    def describe(self) -> str:
        """The line ``db migrate`` prints."""
        if self.before == 0:
            return f"created schema version {self.after}"
        if self.before < self.after:
            return f"upgraded schema from {self.before} to {self.after}"
        return f"schema up to date (version {self.after})"


def check_not_newer(found: int | None, backend: Backend) -> None:
    """Raise SchemaTooNew when ``found`` (the database's version) is beyond this build."""
    supported = latest_version(backend)
    if found is not None and found > supported:
        raise SchemaTooNew(found, supported)


def postgres_version(conn: psycopg.Connection[Any]) -> int | None:
    """The newest migration recorded in the database (None: no schema yet)."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [MIGRATIONS_TABLE]).fetchone()
    if row is None or not row[0]:
        return None
    found = conn.execute(f"SELECT max(version) FROM {MIGRATIONS_TABLE}").fetchone()
    return None if found is None or found[0] is None else int(found[0])


def sqlite_version(conn: sqlite3.Connection) -> int | None:
    """The newest migration recorded in the file (None: no schema yet)."""
    done = _sqlite_applied(conn)
    return max(done) if done else None


def _apply_pending(conn: Any, backend: Backend, done: set[int], run: Callable[[str], object],
                   values: str) -> Migrated:
    """Run each migration not in ``done`` (the versions recorded), in order, and record it;
    SchemaTooNew first when a newer build migrated the database. In the caller's transaction."""
    check_not_newer(max(done, default=None), backend)
    for migration in load_migrations(backend):
        if migration.version not in done:
            run(migration.sql)
            conn.execute(f"INSERT INTO {MIGRATIONS_TABLE} (version, name) VALUES {values}",
                         (migration.version, migration.name))
    return Migrated(max(done, default=0), latest_version(backend))


# -- PostgreSQL -----------------------------------------------------------------


#: How long one try of a migration waits for a table's lock. ALTER TABLE queues every
#: later reader of the table behind its own request: behind a session idle in a
#: transaction, a longer wait would stall every replica's reads until their statement
#: timeout. Readers get through between tries; after LOCK_TRIES the run gives up.
LOCK_TIMEOUT_MS = 1000
LOCK_TRIES = 3

# Who holds a lock on the control-plane tables (asked when a try gave up on one).
_LOCK_HOLDERS = (
    "SELECT DISTINCT a.pid, coalesce(a.state, '?'), coalesce(a.application_name, '')"
    " FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
    " JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.granted AND l.pid <> pg_backend_pid() AND c.relname LIKE 'supervisor%%'"
    " ORDER BY a.pid"
)


def migrate_postgres(conn: psycopg.Connection[Any], *, channel: str) -> Migrated:
    """Apply pending migrations and reconcile the NOTIFY trigger; say what was done.

    ``conn`` must be in autocommit mode (the run is its own explicit transaction,
    or a savepoint of the caller's). A lock it cannot have within LOCK_TIMEOUT_MS is
    tried again, LOCK_TRIES times, then refused (CONFLICT) naming who holds one.

    The run holds a transaction-scoped advisory lock: replicas migrating at once
    queue. The NOTIFY trigger is reconciled at every run, not versioned: its channel
    (its argument) comes from the configuration. So changing ``[control_plane].channel``
    and migrating again re-points it. The channel is checked as an identifier again
    here, then passed as a quoted literal, never spliced.
    """
    from psycopg import errors

    if not _CHANNEL.match(channel):
        raise ValueError(f"invalid NOTIFY channel {channel!r}")
    for attempt in range(LOCK_TRIES):
        try:
            return _migrate_postgres_once(conn, channel)
        except errors.LockNotAvailable as exc:
            if attempt < LOCK_TRIES - 1:
                continue
            holders = ", ".join(f"pid {pid} ({state}{', ' + app if app else ''})"
                                for pid, state, app in conn.execute(_LOCK_HOLDERS))
            raise ControlPlaneError(
                f"the migration waited {LOCK_TRIES} times {LOCK_TIMEOUT_MS} ms for a lock on "
                f"the control-plane tables, held by {holders or 'another session'}; readers "
                "went ahead meanwhile: run it again once that transaction ends",
                category=FailureCategory.CONFLICT) from exc
    raise AssertionError("unreachable")


def _migrate_postgres_once(conn: psycopg.Connection[Any], channel: str) -> Migrated:
    from psycopg import sql

    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])
        # After the advisory lock: replicas migrating at once queue on it unbounded.
        conn.execute(f"SET LOCAL lock_timeout = {int(LOCK_TIMEOUT_MS)}")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version integer PRIMARY KEY,"
                     " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        # No parameters: psycopg sends a script with the simple-query protocol,
        # which allows several statements (and $$-quoted function bodies).
        migrated = _apply_pending(
            conn, "postgresql",
            {row[0] for row in conn.execute(f"SELECT version FROM {MIGRATIONS_TABLE}")},
            lambda script: conn.execute(script.encode("utf-8")), "(%s, %s)")

        current = conn.execute(
            "SELECT t.tgargs FROM pg_trigger t"
            " WHERE t.tgname = %s AND t.tgrelid = 'supervisor_desired'::regclass",
            [TRIGGER_NAME],
        ).fetchone()
        wanted = channel.encode("ascii") + b"\x00"  # tgargs: NUL-terminated arguments
        if current is None or bytes(current[0]) != wanted:
            trigger = sql.Identifier(TRIGGER_NAME)
            conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON supervisor_desired").format(trigger))
            conn.execute(sql.SQL("CREATE TRIGGER {} AFTER INSERT OR UPDATE ON supervisor_desired"
                                 " FOR EACH ROW EXECUTE FUNCTION supervisor_desired_notify({})")
                         .format(trigger, sql.Literal(channel)))
    return migrated


# -- SQLite ---------------------------------------------------------------------


def _sqlite_applied(conn: sqlite3.Connection, *, create: bool = False) -> set[int]:
    """The versions recorded in the file; ``create`` makes the table when missing."""
    if create:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version INTEGER PRIMARY KEY,"
                     " name TEXT NOT NULL,"
                     " applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))")
    elif conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                      (MIGRATIONS_TABLE,)).fetchone() is None:
        return set()
    return {row[0] for row in conn.execute(f"SELECT version FROM {MIGRATIONS_TABLE}")}


def _sqlite_statements(script: str) -> list[str]:
    # executescript() would COMMIT whatever transaction is open first, which
    # would break "the migration and its record commit together": split instead.
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            if pending.strip():
                statements.append(pending)
            pending = ""
    leftover = [ln for ln in pending.splitlines() if ln.strip() and not ln.strip().startswith("--")]
    if leftover:
        raise ValueError(f"incomplete SQL statement at the end of a migration: {leftover[0]!r}")
    return statements


@contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One SQLite write transaction: committed when the block returns, rolled back when it
    raises. IMMEDIATE takes the write lock up front, so two writers serialise at BEGIN
    instead of failing halfway with SQLITE_BUSY."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def migrate_sqlite(conn: sqlite3.Connection) -> Migrated:
    """Apply pending migrations; say what was done.

    ``conn`` must have ``isolation_level=None`` (transactions are explicit).
    An up-to-date database is only read, so a read-only file still opens.
    """
    done = _sqlite_applied(conn)
    check_not_newer(max(done, default=None), "sqlite")
    latest = latest_version("sqlite")
    if all(m.version in done for m in load_migrations("sqlite")):
        return Migrated(latest, latest)
    try:
        with write_transaction(conn):  # two processes migrating at once serialise here
            return _apply_pending(conn, "sqlite", _sqlite_applied(conn, create=True),
                                  lambda script: [conn.execute(statement) for statement
                                                  in _sqlite_statements(script)], "(?, ?)")
    except BaseException as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_READONLY:
            # A reader without write access cannot upgrade the file; SQLite's
            # own "attempt to write a readonly database" would not say why it tried.
            before = max(done, default=0)
            found = f"is version {before}, older than" if before else "is missing, version"
            raise ControlPlaneError(
                f"the control-plane schema {found} this build's {latest}, and the file is "
                "read-only here: run `trio-supervisor db migrate` where it can be written",
                category=FailureCategory.INVALID) from exc
        raise
