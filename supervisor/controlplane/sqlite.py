"""The embedded SQLite control-plane store: the PostgreSQL store's semantics, one file.

Same tables (docs/control-plane.md, minus the NOTIFY trigger: replicas on
SQLite converge by polling alone), same hydration checks
(:func:`~supervisor.controlplane.checks.check_hydrated`), same failure
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

import os
from typing import TYPE_CHECKING

import trio

from supervisor.config import sqlite_path
from supervisor.controlplane import migrations, revisions
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.controlplane.runner import ConnectionRunner
from supervisor.controlplane.sqlite_driver import SQLiteConnections, map_error
from supervisor.logs import get_logger

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig

__all__ = ["SQLiteStore"]

log = get_logger("controlplane")

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


class SQLiteStore(revisions.DatabaseStore):
    """ControlPlaneStore on an SQLite file (see the module docstring)."""

    _sql = revisions.sqlite

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

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    @property
    def identity(self) -> str | None:
        """``sqlite:<device>:<inode>`` of the open file (None before the first call)."""
        file_id = self._connections.file_id
        if file_id is None:
            return None
        return f"sqlite:{file_id[0]}:{file_id[1]}"

    async def migrate(self) -> migrations.Migrated:
        # Opening the connection migrates; this makes sure one is open (and
        # migrates again, harmlessly, in case the file was replaced meanwhile).
        # What the open did counts: a new file is created there, not here.
        done = await self._runner.run("migrate", migrations.migrate_sqlite)
        opened = self._connections.take_migrated()
        if opened is not None:
            done = migrations.Migrated(opened.before, done.after)
        log.info("control-plane schema migrated" if done.before < done.after
                 else "control-plane schema up to date",
                 before=done.before, version=done.after, path=self._path)
        return done

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
