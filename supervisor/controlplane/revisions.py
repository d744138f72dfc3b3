"""The revision lifecycle's statements: history, one revision, rollback, prune, changes.

Blocking functions that take a driver connection, one set per dialect; the
stores run them through their usual ``_run`` (worker thread, deadline,
interruption, error mapping), so they fail exactly like every other store call.
Contracts, the same for both dialects:

- :func:`history`: the newest ``limit`` revisions (all when None), newest first,
  without bodies, and the desired revision id read in the same statement.
- :func:`read_revision`: one revision by id, its body checked against its digest
  (NOT_FOUND, TooLarge over ``max_revision_bytes``, CORRUPT); the schema version
  is returned as stored, whatever this build reads: the caller decides.
- :func:`rollback`: one statement points desired at ``revision`` if it still
  exists with ``body_sha256`` (so a revision pruned or replaced meanwhile is
  NOT_FOUND, never a dangling or different pointer). On PostgreSQL the trigger
  sends the NOTIFY at commit, as for any publish.
- :func:`changes`: the record of the desired pointer's changes
  (``supervisor_desired_log``), newest first: sequence, revision, when, who, why.
- :func:`prune`: one transaction deletes every revision older than the newest
  ``keep``, never the desired one (the desired row is locked first, so a
  concurrent rollback or publish waits rather than losing its revision).
"""

from __future__ import annotations

import getpass
import os
import sqlite3
import sys
from typing import Any

import psycopg

from supervisor.controlplane.checks import HydrateRow, check_hydrated
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.controlplane.migrations import write_transaction
from supervisor.controlplane.store import DesiredChange, LoadedRevision, RevisionSummary

__all__ = ["DesiredChange", "RevisionSummary", "pg", "sqlite"]


#: The change record's columns, newest first (both stores).
CHANGES_SQL = ("SELECT sequence, revision_id, changed_at, changed_by, message"
               " FROM supervisor_desired_log ORDER BY sequence DESC")


def _not_found(revision: int) -> ControlPlaneError:
    return ControlPlaneError(
        f"revision {revision} does not exist", category=FailureCategory.NOT_FOUND,
        revision=revision,
    )


def _checked(row: tuple[Any, ...] | None, revision: int, max_bytes: int,
             parse_time: Any = None, as_bytes: Any = None) -> LoadedRevision:
    if row is None:
        raise _not_found(revision)
    rid, schema_version, size, body, digest, created_at, message = row
    if as_bytes is not None:
        body, digest = as_bytes(body), as_bytes(digest)
    if parse_time is not None:
        created_at = parse_time(created_at)
    return check_hydrated(
        HydrateRow(revision, rid, schema_version, size, body, digest, created_at, message),
        max_revision_bytes=max_bytes, max_schema_version=sys.maxsize,
    )


class pg:  # a namespace of PostgreSQL statements
    Conn = psycopg.Connection[Any]

    @staticmethod
    def history(conn: Conn, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        with conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT (SELECT revision_id FROM supervisor_desired WHERE singleton),"
                " r.id, r.schema_version, octet_length(r.body), r.body_sha256,"
                " r.created_at, r.message"
                " FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT * FROM supervisor_revisions"
                "   ORDER BY id DESC LIMIT %s) r ON true",
                [limit],
            ).fetchall()
        desired = rows[0][0] if rows else None
        return desired, [
            RevisionSummary(int(rid), int(sv), int(size), bytes(digest), created, message)
            for _, rid, sv, size, digest, created, message in rows if rid is not None
        ]

    @staticmethod
    def read_revision(conn: Conn, revision: int, max_bytes: int) -> LoadedRevision:
        with conn.cursor(binary=True) as cur:
            row = cur.execute(
                "SELECT id, schema_version, octet_length(body),"
                " CASE WHEN octet_length(body) <= %s THEN body END,"
                " body_sha256, created_at, message FROM supervisor_revisions WHERE id = %s",
                [max_bytes, revision],
            ).fetchone()
        return _checked(row, revision, max_bytes)

    @staticmethod
    def rollback(conn: Conn, revision: int, body_sha256: bytes,
                 message: str | None = None) -> int | None:
        """Re-point desired; the id it replaced, read under the same row lock."""
        try:
            with conn.transaction():
                pg.say_why(conn, message)
                # Locked first, so "previous" is what this write replaces: a
                # publish committing meanwhile is waited for, and then read.
                old = conn.execute(
                    "SELECT revision_id FROM supervisor_desired WHERE singleton FOR UPDATE"
                ).fetchone()
                row = conn.execute(
                    "INSERT INTO supervisor_desired (singleton, revision_id)"
                    " SELECT true, id FROM supervisor_revisions"
                    " WHERE id = %s AND body_sha256 = %b"
                    " ON CONFLICT (singleton) DO UPDATE"
                    " SET revision_id = EXCLUDED.revision_id, updated_at = now()"
                    " RETURNING revision_id",
                    [revision, body_sha256],
                ).fetchone()
        except psycopg.errors.ForeignKeyViolation as exc:
            # A prune committed between this statement's read of the revision and
            # its write of the pointer (it waited on the desired row the prune
            # held): the revision is gone, which is what the caller must hear.
            raise _not_found(revision) from exc
        if row is None:  # nothing was written
            raise _not_found(revision)
        return None if old is None else int(old[0])

    @staticmethod
    def say_why(conn: Conn, message: str | None) -> None:
        """Hand the change's message to the recording trigger (this transaction only)."""
        conn.execute("SELECT set_config('supervisor.change_message', %s, true)",
                     [message or ""])

    @staticmethod
    def changes(conn: Conn, limit: int | None) -> list[DesiredChange]:
        rows = conn.execute(CHANGES_SQL + " LIMIT %s", [limit]).fetchall()
        return [DesiredChange(int(q), int(r), at, str(by), msg) for q, r, at, by, msg in rows]

    @staticmethod
    def prune(conn: Conn, keep: int) -> list[int]:
        with conn.transaction():
            row = conn.execute(
                "SELECT revision_id FROM supervisor_desired WHERE singleton FOR UPDATE"
            ).fetchone()
            desired = None if row is None else int(row[0])
            rows = conn.execute(
                "DELETE FROM supervisor_revisions WHERE id NOT IN"
                " (SELECT id FROM supervisor_revisions ORDER BY id DESC LIMIT %s)"
                " AND id IS DISTINCT FROM %s RETURNING id",
                [keep, desired],
            ).fetchall()
        return sorted(int(r[0]) for r in rows)


class sqlite:  # a namespace of SQLite statements
    SIZE = "CASE typeof(body) WHEN 'blob' THEN length(body) ELSE length(CAST(body AS BLOB)) END"

    @staticmethod
    def history(conn: sqlite3.Connection, limit: int | None,
                as_bytes: Any, parse_time: Any) -> tuple[int | None, list[RevisionSummary]]:
        conn.execute("BEGIN")  # one read transaction: the pointer and the list agree
        try:
            row = conn.execute("SELECT revision_id FROM supervisor_desired WHERE singleton"
                               ).fetchone()
            rows = conn.execute(
                f"SELECT id, schema_version, {sqlite.SIZE}, body_sha256, created_at, message"
                " FROM supervisor_revisions ORDER BY id DESC LIMIT ?",
                (-1 if limit is None else limit,),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        return (None if row is None else int(row[0])), [
            RevisionSummary(int(rid), int(sv), int(size), as_bytes(digest) or b"",
                            parse_time(created), message)
            for rid, sv, size, digest, created, message in rows
        ]

    @staticmethod
    def read_revision(conn: sqlite3.Connection, revision: int, max_bytes: int,
                      as_bytes: Any, parse_time: Any) -> LoadedRevision:
        row = conn.execute(
            f"SELECT id, schema_version, {sqlite.SIZE},"
            f" CASE WHEN {sqlite.SIZE} <= ? THEN body END,"
            " body_sha256, created_at, message FROM supervisor_revisions WHERE id = ?",
            (max_bytes, revision),
        ).fetchone()
        return _checked(row, revision, max_bytes, parse_time=parse_time, as_bytes=as_bytes)

    @staticmethod
    def rollback(conn: sqlite3.Connection, revision: int, body_sha256: bytes,
                 now: str, message: str | None = None) -> int | None:
        """Re-point desired; the id it replaced, read in the same write transaction."""
        with write_transaction(conn):
            old = conn.execute("SELECT revision_id FROM supervisor_desired WHERE singleton"
                               ).fetchone()
            row = conn.execute(
                "INSERT INTO supervisor_desired (singleton, revision_id)"
                " SELECT TRUE, id FROM supervisor_revisions WHERE id = ? AND body_sha256 = ?"
                " ON CONFLICT (singleton) DO UPDATE"
                f" SET revision_id = excluded.revision_id, updated_at = {now}"
                " RETURNING revision_id",
                (revision, body_sha256),
            ).fetchone()
            if row is None:
                raise _not_found(revision)  # rolled back: nothing to change
            sqlite.say_who_and_why(conn, message)
        return None if old is None else int(old[0])

    @staticmethod
    def say_who_and_why(conn: sqlite3.Connection, message: str | None) -> None:
        """Put who made the change just written, and why, on its record (same transaction).

        SQLite has no database role: the change is the OS user's.
        """
        conn.execute(
            "UPDATE supervisor_desired_log SET changed_by = ?, message = ? WHERE sequence ="
            " (SELECT sequence FROM supervisor_desired WHERE singleton)",
            (_os_user(), message),
        )

    @staticmethod
    def changes(conn: sqlite3.Connection, limit: int | None,
                parse_time: Any) -> list[DesiredChange]:
        rows = conn.execute(CHANGES_SQL + " LIMIT ?", (-1 if limit is None else limit,)
                            ).fetchall()
        return [DesiredChange(int(q), int(r), parse_time(at), str(by), msg)
                for q, r, at, by, msg in rows]

    @staticmethod
    def prune(conn: sqlite3.Connection, keep: int) -> list[int]:
        with write_transaction(conn):
            row = conn.execute("SELECT revision_id FROM supervisor_desired WHERE singleton"
                               ).fetchone()
            rows = conn.execute(
                "DELETE FROM supervisor_revisions WHERE id NOT IN"
                " (SELECT id FROM supervisor_revisions ORDER BY id DESC LIMIT ?)"
                " AND id IS NOT ? RETURNING id",
                (keep, None if row is None else row[0]),
            ).fetchall()
        return sorted(int(r[0]) for r in rows)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (a bare container)
        return f"uid {os.getuid()}"
