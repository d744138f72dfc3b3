"""Plain SQL against the test database, shared by the process tests.

Publishing as an operator's script would (``publish_sql``, ``sql_publish``),
and the daemon's LISTEN backends (``listener_pids``).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg


def sql_publish(pg_url: str) -> int:
    body = b'{"schema_version": 1, "aliases": {"sql": {"upstream": "https://sql.example/"}}}'
    with psycopg.connect(pg_url) as conn:
        rid = conn.execute(
            "INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)"
            " VALUES (1, %s, sha256(%s), 'plain sql') RETURNING id", (body, body),
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO supervisor_desired (singleton, revision_id, updated_at)"
            " VALUES (true, %s, now()) ON CONFLICT (singleton) DO UPDATE"
            " SET revision_id = excluded.revision_id, updated_at = now()", (rid,))
    return int(rid)


def listener_pids(pg_url: str) -> list[int]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE 'LISTEN%%' AND pid <> pg_backend_pid()").fetchall()
    return [int(row[0]) for row in rows]


def body(*aliases: str, **extra: Any) -> bytes:
    return json.dumps({"schema_version": 1, "aliases": {
        a: {"upstream": f"https://{a}.example/v1", **extra} for a in aliases}}).encode()


def publish_sql(conn: psycopg.Connection[Any], data: bytes) -> int:
    rid = conn.execute(
        "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
        " VALUES (1, %s, sha256(%s)) RETURNING id", (data, data)).fetchone()
    assert rid is not None
    conn.execute(
        "INSERT INTO supervisor_desired (singleton, revision_id) VALUES (true, %s)"
        " ON CONFLICT (singleton) DO UPDATE SET revision_id = excluded.revision_id",
        (rid[0],))
    return int(rid[0])
