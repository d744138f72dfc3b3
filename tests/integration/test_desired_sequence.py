"""The desired pointer's sequence and change record, on both control planes.

Every change of ``supervisor_desired`` (publish, rollback, plain SQL) raises
the sequence by one and leaves one row in ``supervisor_desired_log`` saying
who made it and why; the sequence never goes down, and a database of schema
version 1 is upgraded in place with its current pointer as change 1.
"""

from __future__ import annotations

import getpass
import hashlib
import sqlite3
from collections.abc import AsyncIterator

import psycopg
import pytest
import trio

from supervisor.controlplane import migrations
from supervisor.controlplane.store import ControlPlaneStore
from tests.stores import doc, make_store


@pytest.fixture(params=["postgresql", "sqlite"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_url" if request.param == "postgresql"
                                       else "sqlite_url"))


@pytest.fixture
async def store(url: str) -> AsyncIterator[ControlPlaneStore]:
    s = make_store(url, max_revision_bytes=4096)
    await s.migrate()
    try:
        yield s
    finally:
        await s.aclose()


def _sql(url: str, statement: str) -> None:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(statement)
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute(statement.encode())


async def _sequence(store: ControlPlaneStore) -> int | None:
    pointer = await store.observe()
    assert pointer is not None
    loaded = await store.hydrate()
    assert loaded is not None and loaded.sequence == pointer.sequence
    return pointer.sequence


async def test_publish_and_rollback_each_raise_the_sequence_by_one(
        store: ControlPlaneStore) -> None:
    with trio.fail_after(30):
        first = await store.publish(doc(n=1), 1, "first")
        assert await _sequence(store) == 1
        await store.publish(doc(n=2), 1, "second")
        assert await _sequence(store) == 2
        await store.rollback(first, hashlib.sha256(doc(n=1)).digest(), "bad deploy")
        pointer = await store.observe()
        assert pointer is not None
        assert (pointer.revision, pointer.sequence) == (first, 3)


async def test_the_change_record_says_who_and_why_newest_first(
        store: ControlPlaneStore, url: str) -> None:
    with trio.fail_after(30):
        first = await store.publish(doc(n=1), 1, "first")
        second = await store.publish(doc(n=2), 1, None)
        await store.rollback(first, hashlib.sha256(doc(n=1)).digest(), "bad deploy")
        changes = await store.changes(None)
        assert [(c.sequence, c.revision_id, c.message) for c in changes] == [
            (3, first, "bad deploy"), (2, second, None), (1, first, "first")]
        who = "postgres" if url.startswith("postgresql") else getpass.getuser()
        assert all(c.changed_by.split("@")[0] == who for c in changes)
        assert all(c.changed_at is not None for c in changes)
        assert [c.sequence for c in await store.changes(1)] == [3]


async def test_plain_sql_changes_are_counted_and_cannot_lower_the_sequence(
        store: ControlPlaneStore, url: str) -> None:
    with trio.fail_after(30):
        first = await store.publish(doc(n=1), 1, None)
        await store.publish(doc(n=2), 1, None)
        _sql(url, f"UPDATE supervisor_desired SET revision_id = {first}")
        assert await _sequence(store) == 3
        # A hand-written sequence is overruled (PostgreSQL) or raised past (SQLite).
        _sql(url, "UPDATE supervisor_desired SET sequence = 0")
        assert await _sequence(store) == 4
        # Deleting the row and inserting it again continues the count.
        _sql(url, "DELETE FROM supervisor_desired")
        _sql(url, f"INSERT INTO supervisor_desired (singleton, revision_id) VALUES (true, {first})")
        assert await _sequence(store) == 5
        changes = await store.changes(None)
        assert [c.sequence for c in changes] == [5, 4, 3, 2, 1]
        assert changes[0].changed_by.split("@")[0] in {"postgres", "sql"}


async def test_a_version_1_database_is_upgraded_in_place(url: str) -> None:
    with trio.fail_after(30):
        v1 = next(m for m in migrations.load_migrations(
            "postgresql" if url.startswith("postgresql") else "sqlite") if m.version == 1)
        if url.startswith("sqlite"):
            with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
                for statement in migrations._sqlite_statements(v1.sql):
                    conn.execute(statement)
                conn.execute(f"CREATE TABLE {migrations.MIGRATIONS_TABLE} (version INTEGER"
                             " PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT)")
                conn.execute(f"INSERT INTO {migrations.MIGRATIONS_TABLE} VALUES (1, 'initial', '')")
        else:
            with psycopg.connect(url, autocommit=True) as pg:
                pg.execute(v1.sql.encode())
                pg.execute(f"CREATE TABLE {migrations.MIGRATIONS_TABLE} (version integer"
                           " PRIMARY KEY, name text NOT NULL, applied_at timestamptz)")
                pg.execute(f"INSERT INTO {migrations.MIGRATIONS_TABLE} VALUES (1, 'initial', now())")
        body = doc(n=7)
        digest = hashlib.sha256(body).hexdigest()
        _sql(url, "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                  f" VALUES (1, X'{body.hex()}', X'{digest}')" if url.startswith("sqlite") else
                  "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                  f" VALUES (1, '\\x{body.hex()}', '\\x{digest}')")
        _sql(url, "INSERT INTO supervisor_desired (singleton, revision_id) VALUES (true, 1)")
        s = make_store(url)
        try:
            await s.migrate()
            assert await _sequence(s) == 1
            assert [(c.sequence, c.revision_id, c.changed_by) for c in await s.changes(None)] == [
                (1, 1, "db migrate")]
            await s.publish(doc(n=8), 1, None)
            assert await _sequence(s) == 2
        finally:
            await s.aclose()
