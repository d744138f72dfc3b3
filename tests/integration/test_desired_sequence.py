"""The desired pointer's sequence and change record, on both control planes.

Every change of ``supervisor_desired`` (publish, rollback, plain SQL) raises
the sequence by one and leaves one row in ``supervisor_desired_log`` saying
who made it and why; the sequence never goes down, and a database of schema
version 1 is upgraded in place with its current pointer as change 1.
"""

from __future__ import annotations

import getpass
import hashlib
import random
import sqlite3
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import psycopg
import pytest
import trio

from supervisor.controlplane import migrations
from supervisor.controlplane.errors import ControlPlaneError
from supervisor.controlplane.store import RevisionAdmin
from tests.proc import EXAMPLE, cli, write_config
from tests.stores import doc, make_store, waits_on_the_desired_row


@pytest.fixture(params=["postgresql", "sqlite"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_url" if request.param == "postgresql"
                                       else "sqlite_url"))


@pytest.fixture
async def store(url: str) -> AsyncIterator[RevisionAdmin]:
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


async def _sequence(store: RevisionAdmin) -> int | None:
    pointer = await store.observe()
    assert pointer is not None
    loaded = await store.hydrate()
    assert loaded is not None and loaded.sequence == pointer.sequence
    return pointer.sequence


async def test_publish_and_rollback_each_raise_the_sequence_by_one(
        store: RevisionAdmin) -> None:
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
        store: RevisionAdmin, url: str) -> None:
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


async def test_the_rollback_commands_message_is_recorded_with_the_change(
        store: RevisionAdmin, url: str, tmp_path: Path) -> None:
    config = str(write_config(tmp_path, url))
    for _ in range(2):
        cli("publish", "--config", config, "--force", "--message", "a deploy", str(EXAMPLE))
    cli("rollback", "--config", config, "1", "--message", "bad deploy")
    with trio.fail_after(30):
        changes = await store.changes(None)
    assert [(c.sequence, c.revision_id, c.message) for c in changes] == [
        (3, 1, "bad deploy"), (2, 2, "a deploy"), (1, 1, "a deploy")]


async def test_plain_sql_changes_are_counted_and_cannot_lower_the_sequence(
        store: RevisionAdmin, url: str) -> None:
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


async def test_a_plain_sql_writer_choosing_the_sequence_is_overruled_and_recorded(
        store: RevisionAdmin, url: str) -> None:
    with trio.fail_after(30):
        first = await store.publish(doc(n=1), 1, None)
        second = await store.publish(doc(n=2), 1, None)
        _sql(url, f"UPDATE supervisor_desired SET revision_id = {first}, sequence = 1000")
        assert await _sequence(store) == 3
        _sql(url, f"UPDATE supervisor_desired SET revision_id = {second},"
                  " sequence = sequence + 1")
        assert await _sequence(store) == 4
        _sql(url, "DELETE FROM supervisor_desired")
        _sql(url, "INSERT INTO supervisor_desired (singleton, revision_id, sequence)"
                  f" VALUES (true, {first}, 5)")
        assert await _sequence(store) == 5
        assert [(c.sequence, c.revision_id) for c in await store.changes(None)] == [
            (5, first), (4, second), (3, first), (2, second), (1, first)]


async def test_a_publish_that_waited_for_the_row_to_be_deleted_takes_the_next_sequence(
        pg_url: str) -> None:
    """INSERT ... ON CONFLICT numbers its row before it waits on a conflicting writer: when
    that writer changed the pointer and then deleted the row, the number is already taken."""
    with trio.fail_after(30):
        s = make_store(pg_url)
        try:
            await s.migrate()
            first = await s.publish(doc(n=1), 1, None)
            published: list[int] = []

            async def publish() -> None:
                published.append(await s.publish(doc(n=2), 1, "after the delete"))

            with psycopg.connect(pg_url) as writer:
                writer.execute(f"UPDATE supervisor_desired SET revision_id = {first}")
                writer.execute("DELETE FROM supervisor_desired")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(publish)
                    await waits_on_the_desired_row(pg_url)
                    writer.commit()
            assert await _sequence(s) == 3
            assert [(c.sequence, c.revision_id, c.message) for c in await s.changes(None)] == [
                (3, published[0], "after the delete"), (2, first, None), (1, first, None)]
        finally:
            await s.aclose()


async def test_a_publisher_role_granted_what_version_1_needed_still_publishes(
        pg_url: str) -> None:
    """The change record is the schema's own bookkeeping: a role that may write the
    revisions and the pointer (all a publisher needed before version 2) publishes and
    rolls back, and its change is recorded under its own name."""
    role = f"tsup_publisher_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN'.encode())
    try:
        with trio.fail_after(30):
            owner = make_store(pg_url)
            try:
                await owner.migrate()
                first = await owner.publish(doc(n=1), 1, None)
                _sql(pg_url, "GRANT SELECT, INSERT, UPDATE ON supervisor_revisions,"
                             f' supervisor_desired TO "{role}"')
                _sql(pg_url, "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public"
                             f' TO "{role}"')
                base, _, dbname = pg_url.rpartition("/")
                host = base.rpartition("@")[2]
                publisher = make_store(f"postgresql://{role}@{host}/{dbname}")
                try:
                    second = await publisher.publish(doc(n=2), 1, "by the publisher")
                    await publisher.rollback(first, hashlib.sha256(doc(n=1)).digest(), "back")
                finally:
                    await publisher.aclose()
                changes = await owner.changes(None)
            finally:
                await owner.aclose()
        assert [(c.revision_id, c.changed_by.split("@")[0], c.message)
                for c in changes] == [(first, role, "back"), (second, role, "by the publisher"),
                                      (first, "postgres", None)]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f'DROP OWNED BY "{role}"'.encode())
            admin.execute(f'DROP ROLE "{role}"'.encode())


def _write_concurrently(pg_url: str, seed: int, ids: list[int]) -> None:
    """One connection's share of publishes, rollbacks, plain updates and delete+insert."""
    rng = random.Random(seed)
    upsert = ("INSERT INTO supervisor_desired (singleton, revision_id) VALUES (true, %s)"
              " ON CONFLICT (singleton) DO UPDATE SET revision_id = excluded.revision_id")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for _ in range(25):
            revision = rng.choice(ids)
            kind = rng.randrange(4)
            with conn.transaction():
                if kind == 0:  # publish's write
                    conn.execute("SELECT set_config('supervisor.change_message', %s, true)",
                                 [f"writer {seed}"])
                    conn.execute(upsert, [revision])
                elif kind == 1:  # rollback's write
                    conn.execute("SELECT 1 FROM supervisor_desired WHERE singleton FOR UPDATE")
                    conn.execute("UPDATE supervisor_desired SET revision_id = %s", [revision])
                elif kind == 2:  # a plain writer choosing the sequence
                    conn.execute("UPDATE supervisor_desired SET revision_id = %s, sequence = 0",
                                 [revision])
                else:
                    conn.execute("DELETE FROM supervisor_desired")
            if kind == 3:
                conn.execute(upsert, [revision])


async def test_writers_on_many_connections_never_repeat_or_skip_a_sequence(
        pg_url: str) -> None:
    with trio.fail_after(120):
        s = make_store(pg_url)
        try:
            await s.migrate()
            ids = [await s.publish(doc(n=n), 1, None) for n in range(4)]
            async with trio.open_nursery() as nursery:
                for seed in range(8):
                    nursery.start_soon(partial(trio.to_thread.run_sync, _write_concurrently,
                                               pg_url, seed, ids))
            changes = await s.changes(None)
            pointer = await s.observe()
        finally:
            await s.aclose()
        sequences = sorted(c.sequence for c in changes)
        assert sequences == list(range(1, len(changes) + 1))
        assert len(changes) > len(ids) + 8 * 25 // 2  # every write but the deletes counted
        assert pointer is not None
        assert (pointer.sequence, pointer.revision) == (changes[0].sequence,
                                                        changes[0].revision_id)


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


async def test_the_log_takes_rows_only_from_the_trigger_and_sequences_stay_below_2_62(
        store: RevisionAdmin, url: str) -> None:
    """A writer's own row in the change record, one at 2^63-2 above all, is refused: it
    would move the next publish to 2^63-1 and every later one out of range."""
    with trio.fail_after(30):
        first = await store.publish(doc(n=1), 1, None)
        for sequence, revision in ((2**63 - 2, first), (2, first + 1)):
            with pytest.raises((psycopg.Error, sqlite3.Error)):
                _sql(url, "INSERT INTO supervisor_desired_log (sequence, revision_id,"
                          f" changed_by) VALUES ({sequence}, {revision}, 'someone')")
        with pytest.raises((psycopg.Error, sqlite3.Error)):
            _sql(url, f"UPDATE supervisor_desired_log SET sequence = {2**63 - 2}")
        await store.publish(doc(n=2), 1, None)
        assert await _sequence(store) == 2
        assert [c.sequence for c in await store.changes(None)] == [2, 1]


async def test_a_sequence_above_2_62_is_refused(store: RevisionAdmin, url: str) -> None:
    """Even where the record was made to reach 2^62 (by the schema's owner, triggers off),
    the next change is refused rather than taken."""
    with trio.fail_after(30):
        await store.publish(doc(n=1), 1, None)
        if url.startswith("sqlite"):
            _sql(url, "DROP TRIGGER supervisor_desired_log_fixed")
            _sql(url, f"UPDATE supervisor_desired_log SET sequence = {2**62}")
        else:
            _sql(url, "ALTER TABLE supervisor_desired_log DISABLE TRIGGER USER;"
                      f" UPDATE supervisor_desired_log SET sequence = {2**62};"
                      " ALTER TABLE supervisor_desired_log ENABLE TRIGGER USER")
        with pytest.raises(ControlPlaneError):
            await store.publish(doc(n=2), 1, None)
        assert await _sequence(store) == 1



async def test_old_changes_may_be_deleted_the_newest_stays_and_publishing_goes_on(
        store: RevisionAdmin, url: str) -> None:
    """The record grows at every change and pruning keeps it, so an operator deletes its
    old rows. The newest holds the sequence the next change follows by +1: deleting it
    (or all, or TRUNCATE) is refused, else every later publish would fail the guard."""
    with trio.fail_after(30):
        for n in range(3):
            await store.publish(doc(n=n), 1, None)
        clear = ["DELETE FROM supervisor_desired_log", "DELETE FROM supervisor_desired_log"
                 " WHERE sequence = 3"] + ([] if url.startswith("sqlite") else
                                           ["TRUNCATE supervisor_desired_log"])
        for statement in clear:
            with pytest.raises((psycopg.Error, sqlite3.Error), match="the newest change stays"):
                _sql(url, statement)
        _sql(url, "DELETE FROM supervisor_desired_log WHERE sequence < 3")
        await store.publish(doc(n=9), 1, "after the clean-up")
        assert await _sequence(store) == 4
        assert [(c.sequence, c.message) for c in await store.changes(None)] == [
            (4, "after the clean-up"), (3, None)]


async def test_a_version_2_record_missing_its_newest_changes_is_restored_by_the_upgrade(
        url: str) -> None:
    """Schema 2 let the newest rows be deleted; the upgrade records the pointer's change
    again, so the first publish after it follows by +1 instead of failing."""
    with trio.fail_after(30):
        s = make_store(url)
        try:
            await s.migrate()
            for n in range(3):
                await s.publish(doc(n=n), 1, None)
            # Back to schema 2 (as the owner may), then a record cleared by hand.
            if url.startswith("sqlite"):
                for trigger in ("log_guard", "log_fixed", "sequence_range", "log_newest"):
                    _sql(url, f"DROP TRIGGER supervisor_desired_{trigger}")
            else:
                _sql(url, "DROP FUNCTION supervisor_desired_log_guard CASCADE;"
                          " ALTER TABLE supervisor_desired DROP CONSTRAINT"
                          " supervisor_desired_sequence_range; ALTER TABLE supervisor_desired_log"
                          " DROP CONSTRAINT supervisor_desired_log_sequence_range")
            _sql(url, f"DELETE FROM {migrations.MIGRATIONS_TABLE} WHERE version = 3")
            _sql(url, "DELETE FROM supervisor_desired_log WHERE sequence > 1")
            await s.aclose()
            s = make_store(url)
            await s.migrate()
            await s.migrate()
            await s.publish(doc(n=9), 1, None)
            assert await _sequence(s) == 4
            assert [(c.sequence, c.changed_by) for c in await s.changes(None)][1:] == [
                (3, "db migrate"), (1, (await s.changes(None))[-1].changed_by)]
        finally:
            await s.aclose()

