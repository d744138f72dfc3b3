"""The embedded SQLite control-plane store: the PostgreSQL store's semantics, in one file."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import quote

from supervisor.config import sqlite_path
from supervisor.controlplane import migrations, revisions
from supervisor.controlplane.errors import (
    MIGRATE_HINT,
    ControlPlaneError,
    FailureCategory,
    one_line,
)
from supervisor.controlplane.runner import ConnectionRunner, dispose_quietly, in_db_thread
from supervisor.logs import get_logger

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig

__all__ = ["EXTENDED_CODES", "RESULT_CODES", "SQLiteStore", "classify", "map_error"]

log = get_logger("controlplane")

T = TypeVar("T")

_U, _C, _I, _D, _X = (FailureCategory.UNAVAILABLE, FailureCategory.CONFLICT,
                      FailureCategory.INVALID, FailureCategory.DENIED, FailureCategory.CORRUPT)

#: SQLite's primary result codes (https://www.sqlite.org/rescode.html), by the
#: sqlite3 module's constant names, reviewed one by one: the label and why.
#: Extended codes carry their primary code in the low byte and take its label
#: unless :data:`EXTENDED_CODES` says otherwise.
RESULT_CODES: dict[str, tuple[FailureCategory, str]] = {
    "SQLITE_ERROR": (_I, "a generic error: a syntax error, a missing table"),
    "SQLITE_INTERNAL": (_U, "SQLite's own malfunction, not the request's"),
    "SQLITE_PERM": (_D, "the access mode asked for is not allowed"),
    "SQLITE_ABORT": (_C, "aborted by another statement's rollback: retry"),
    "SQLITE_BUSY": (_C, "another connection holds the database lock"),
    "SQLITE_LOCKED": (_C, "a table lock held within this process"),
    "SQLITE_NOMEM": (_U, "out of memory: a resource"),
    "SQLITE_READONLY": (_D, "the file or its directory is not writable"),
    "SQLITE_INTERRUPT": (_U, "interrupted: the call was cancelled (a timeout)"),
    "SQLITE_IOERR": (_U, "the OS failed a read, write or sync"),
    "SQLITE_CORRUPT": (_X, "the database file is damaged"),
    "SQLITE_NOTFOUND": (_I, "an unknown file-control opcode: this build's mistake"),
    "SQLITE_FULL": (_U, "the disk is full: a resource"),
    "SQLITE_CANTOPEN": (_U, "the file cannot be opened (missing, a directory, no fds)"),
    "SQLITE_PROTOCOL": (_U, "a file-locking race with another process: transient"),
    "SQLITE_EMPTY": (_I, "unused by SQLite"),
    "SQLITE_SCHEMA": (_C, "the schema changed under a prepared statement (a migration "
                          "in another process): retry"),
    "SQLITE_TOOBIG": (_D, "a value over SQLite's size limit: a bound, like "
                          "max_revision_bytes"),
    "SQLITE_CONSTRAINT": (_I, "a constraint refused the write"),
    "SQLITE_MISMATCH": (_I, "a datatype mismatch"),
    "SQLITE_MISUSE": (_I, "the library was misused: this build's mistake"),
    "SQLITE_NOLFS": (_U, "the host lacks large-file support for the file"),
    "SQLITE_AUTH": (_D, "the authorizer refused the statement"),
    "SQLITE_FORMAT": (_I, "unused by SQLite"),
    "SQLITE_RANGE": (_I, "a parameter index out of range: this build's mistake"),
    "SQLITE_NOTADB": (_X, "the file is not a database"),
    "SQLITE_NOTICE": (_I, "never an error"),
    "SQLITE_WARNING": (_I, "never an error"),
}

#: Extended codes whose meaning differs from their primary code's.
EXTENDED_CODES: dict[str, tuple[FailureCategory, str]] = {
    "SQLITE_READONLY_RECOVERY": (_C, "another connection must recover the WAL first"),
    "SQLITE_READONLY_DBMOVED": (_U, "the file was moved or deleted under the connection"),
}

# Primary codes are below 256, extended ones above: one table holds both.
_BY_CODE: dict[int, FailureCategory] = {
    getattr(sqlite3, name): category
    for name, (category, _why) in (RESULT_CODES | EXTENDED_CODES).items()}
_CONFLICT = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


def classify(exc: BaseException) -> FailureCategory:
    """The failure category of a ``sqlite3`` (or OS) error."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        # Any code not in the tables (a primary code a later SQLite adds): the
        # request itself is wrong until someone reviews it.
        return _BY_CODE.get(code) or _BY_CODE.get(code & 0xFF, FailureCategory.INVALID)
    if isinstance(exc, sqlite3.OperationalError | OSError):
        # No result code: raised by this module or the OS, not by SQLite.
        return FailureCategory.UNAVAILABLE
    return FailureCategory.INVALID


def map_error(exc: BaseException, what: str) -> ControlPlaneError:
    detail = one_line(exc)
    if isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(
            ("no such table", "no such column")):
        detail = f"{detail} ({MIGRATE_HINT})"
    return ControlPlaneError(f"control plane {what} failed: {detail}", category=classify(exc))


def _retry_busy(fn: Callable[[], T], stop: threading.Event, busy_timeout_s: float) -> T:
    """Run ``fn``, re-running it while the database is busy, until ``busy_timeout_s``.

    Blocking (worker thread). Every caller's ``fn`` is safe to re-run: reads, and
    writes that roll back on failure. ``stop`` (set when trio gives the call up) ends
    the wait at once: a cancelled write never goes on to commit once the lock frees.
    """
    deadline = time.monotonic() + busy_timeout_s
    delay = 0.002
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code not in _CONFLICT or time.monotonic() + delay >= deadline:
                raise
        if stop.wait(delay):
            raise sqlite3.OperationalError("interrupted: the call was cancelled")
        delay = min(delay * 2, 0.05)


def _prepare(conn: sqlite3.Connection) -> migrations.Migrated:
    """Switch the file to WAL (best effort) and migrate it; say what the migration did."""
    try:
        # WAL lets the CLI publish while the daemon reads. Persistent in the
        # file; needs write access, so a read-only file stays as it is.
        conn.execute("PRAGMA journal_mode = WAL")
    except sqlite3.OperationalError as exc:
        if classify(exc) is not FailureCategory.DENIED:
            raise
    return migrations.migrate_sqlite(conn)


def _create_private(path: str) -> None:
    """Make ``path`` an empty file of mode 0600 unless something is there already.

    SQLite would create it 0644 (and its -wal and -shm files take the database
    file's mode): the control plane is the daemon's alone. An empty file is an
    empty database to SQLite. Any failure is left for ``sqlite3.connect`` to report.
    """
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))
    with contextlib.suppress(OSError):
        os.close(os.open(path, flags, 0o600))


def _file_id(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of ``path``; None when it does not exist. Raises other OSError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _remove_stale_wal(path: str) -> None:
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


class SQLiteStore(revisions.DatabaseStore):
    """RevisionAdmin on an SQLite file: PostgreSQL's tables, checks and failure categories.

    No NOTIFY trigger: replicas on SQLite converge by polling alone. The schema is
    migrated when the connection first opens (no separate operator step); an
    up-to-date file is only read.

    One stdlib ``sqlite3`` connection (``check_same_thread=False``), used from worker
    threads one call at a time. A cancelled call runs ``Connection.interrupt()``
    (PostgreSQL's cancel, thread-safe) and the connection is replaced. SQLite's own
    busy wait ignores interrupt(), so the store waits for locks itself
    (:func:`_retry_busy`). ``isolation_level=None``: transactions are explicit, so a
    read never leaves one open. Writes take ``BEGIN IMMEDIATE``: two writers queue
    instead of deadlocking on the upgrade. Errors map by SQLite's result code, not
    the exception class (:data:`RESULT_CODES`); a missing table is INVALID with the
    migrate hint. The store is its runner's :class:`~supervisor.controlplane.runner.Driver`;
    its ``identity`` is ``sqlite:<device>:<inode>`` of the file last opened.
    """

    _sql = revisions.sqlite
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, config: ControlPlaneConfig, *, max_schema_version: int,
                 statement_timeout_s: float | None = None, create: bool = True) -> None:
        super().__init__(config, max_schema_version)
        self._path = sqlite_path(config.url)
        # mode=rw never creates the file (the daemon); rwc does (the CLI, which
        # makes the embedded control plane on first publish).
        self._create = create
        # (st_dev, st_ino) of the file the open connection reads: a restore by
        # `mv new.db cp.db` or a deleted file leaves the connection on the old
        # inode, so every call first checks the path still names it.
        self._file_id: tuple[int, int] | None = None
        self._wal_id: tuple[int, int] | None = None
        # What the last open's migration did, until migrate() asks.
        self._migrated: migrations.Migrated | None = None
        # Lock contention should surface as SQLITE_BUSY (CONFLICT, which names
        # the problem) well before the client-side deadline cancels the call.
        # The deadline: [control_plane].read_timeout_s, unless a statement timeout is given.
        deadline_s = (config.read_timeout_s if statement_timeout_s is None
                      else statement_timeout_s + 1.0)
        self._busy_timeout_s = (deadline_s - 1.0) / 2
        self._runner = ConnectionRunner(self, deadline_s=deadline_s, before=self._check_file)

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    async def migrate(self) -> migrations.Migrated:
        # Opening the connection migrates; this makes sure one is open (and
        # migrates again, harmlessly, in case the file was replaced meanwhile).
        # What the open did counts: a new file is created there, not here.
        done = await self._runner.run("migrate", migrations.migrate_sqlite)
        opened, self._migrated = self._migrated, None
        if opened is not None:
            done = migrations.Migrated(opened.before, done.after)
        log.info("control-plane schema migrated" if done.before < done.after
                 else "control-plane schema up to date",
                 before=done.before, version=done.after, path=self._path)
        return done

    # -- the runner's driver (blocking, in worker threads) ----------------------------

    def open(self, stop: threading.Event) -> sqlite3.Connection:
        path = self._path
        uri = f"file:{quote(path)}?mode={'rwc' if self._create else 'rw'}"
        if self._create:
            _create_private(path)
        # timeout=0: SQLite's own busy wait cannot be interrupted (a cancelled
        # call would sleep it out and then, the lock gone, commit anyway);
        # _retry_busy waits instead, and stops when told to.
        conn = sqlite3.connect(uri, timeout=0, check_same_thread=False, isolation_level=None,
                               uri=True)
        try:
            st = os.stat(path)
            self._file_id = (st.st_dev, st.st_ino)
            self.identity = f"sqlite:{st.st_dev}:{st.st_ino}"
            # Per connection in SQLite; without it the REFERENCES clause is decorative.
            conn.execute("PRAGMA foreign_keys = ON")
            # Both steps may meet a lock (another process migrating, or a
            # closing connection checkpointing the WAL): waited out like any other.
            migrated = _retry_busy(partial(_prepare, conn), stop, self._busy_timeout_s)
            if migrated.before < migrated.after:
                self._migrated = migrated
                log.info("control-plane schema migrated", before=migrated.before,
                         version=migrated.after, path=path)
        except BaseException:
            conn.close()
            raise
        return conn

    def received(self) -> None:
        """None: a file has no bytes in flight to count."""

    def setup(self, conn: sqlite3.Connection) -> None:
        """Nothing: open() prepared it (SQLite's own waits honour ``stop`` there)."""

    def call(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T],
             stop: threading.Event) -> T:
        return _retry_busy(partial(fn, conn), stop, self._busy_timeout_s)

    def interrupt(self, conn: sqlite3.Connection, stop: threading.Event) -> None:
        stop.set()
        conn.interrupt()

    def close(self, conn: sqlite3.Connection) -> None:
        dispose_quietly(conn.close)

    map_error = staticmethod(map_error)

    def keeps(self, conn: sqlite3.Connection, error: ControlPlaneError) -> bool:
        # Reopen next time: the file may have been replaced, repaired or made
        # readable meanwhile. Contention keeps the connection.
        return error.category is FailureCategory.CONFLICT

    # -- before every call ---------------------------------------------------------

    async def _check_file(self, what: str) -> None:
        try:
            await self._still_same_file()
        except OSError as exc:
            raise map_error(exc, what=what) from exc

    async def _still_same_file(self) -> None:
        """Drop the connection when the path no longer names the file it reads.

        Raises the ``unavailable`` error when the file is gone. The daemon does not create
        one: a vanished control plane is an outage, not an empty one.

        A replaced file may have the *previous* file's ``-wal`` and ``-shm`` beside it, left
        by a process that still has the old file open (an operator's shell, a CLI
        command). Opening the new file would replay the old WAL over it, silently undoing
        the restore. So the WAL's inode is recorded while the file is unchanged. After a
        replacement, a WAL with that inode belongs to the old file, whose name is gone:
        nobody can open it again. It is removed with its shared-memory index.
        """
        conn = self._runner.connection
        path = self._path
        # Inside the runner's call: its deadline bounds these.
        current = await in_db_thread(partial(_file_id, path), "the control-plane file's status")
        wal = await in_db_thread(partial(_file_id, path + "-wal"), "the WAL's status")
        # The file last opened, kept after its connection was dropped: a restore
        # may come in two steps (the file moved away, an outage, then the new
        # one moved in), and the new file must be checked against the old WAL
        # then too, not only when a connection was open at the replacement.
        known = self._file_id
        if known is not None and current != known:
            if conn is not None:
                log.warning("control-plane file replaced or removed; reopening"
                            if current is not None else "control-plane file removed", path=path)
                await self._runner.discard()
            if current is not None:
                if wal is not None and wal == self._wal_id:
                    await in_db_thread(partial(_remove_stale_wal, path), "a stale WAL's removal")
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
                " this configuration creates it)", category=FailureCategory.UNAVAILABLE)
