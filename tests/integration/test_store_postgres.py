"""The PostgreSQL store against a real server: round trips, and each failure category
produced by a real fault (a fresh database per test, from the ``pg_url`` fixture)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest
import trio

from supervisor import reasons
from supervisor.controlplane import migrations
from supervisor.controlplane.errors import (
    ControlPlaneError,
    FailureCategory,
    Incompatible,
    TooLarge,
)
from supervisor.controlplane.postgres import PostgresStore
from supervisor.controlplane.store import RevisionAdmin
from tests.pgserver import Server
from tests.proc import free_port
from tests.stores import doc, make_store


async def sql(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on a fresh autocommit connection, off the trio thread."""

    def run() -> list[tuple[Any, ...]]:
        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    return await trio.to_thread.run_sync(run)


def plain_sql_publish(conn: psycopg.Connection[Any], body: bytes, schema_version: int = 1) -> int:
    """Publish the way docs/control-plane.md lets anyone: insert, point desired, commit."""
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)"
            " VALUES (%s, %s, sha256(%s), 'plain sql') RETURNING id",
            (schema_version, body, body),
        ).fetchone()
        assert row is not None
        conn.execute(
            "INSERT INTO supervisor_desired (revision_id) VALUES (%s)"
            " ON CONFLICT (singleton) DO UPDATE"
            " SET revision_id = EXCLUDED.revision_id, updated_at = now()",
            (row[0],),
        )
    return int(row[0])


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[RevisionAdmin]:
    s = make_store(pg_url)
    with trio.fail_after(15):
        await s.migrate()
    yield s
    with trio.fail_after(5):
        await s.aclose()


# -- schema ----------------------------------------------------------------------


async def test_migrate_twice_is_harmless(pg_url: str) -> None:
    s = make_store(pg_url)
    with trio.fail_after(20):
        await s.migrate()
        rid = await s.publish(doc(), 1, "before")
        await s.migrate()
        assert await s.desired() == rid
        versions = await sql(pg_url, "SELECT version FROM supervisor_schema_migrations"
                                     " ORDER BY version")
        assert versions == [(1,), (2,), (3,)]
        triggers = await sql(
            pg_url,
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'supervisor_desired'::regclass"
            " AND NOT tgisinternal ORDER BY tgname",
        )
        assert triggers == [("supervisor_desired_notify",), ("supervisor_desired_record",),
                            ("supervisor_desired_sequence",)]
        await s.aclose()


async def test_migrate_repoints_the_trigger_when_the_channel_changes(pg_url: str) -> None:
    with trio.fail_after(20):
        first = make_store(pg_url)
        await first.migrate()
        await first.aclose()
        second = make_store(pg_url, channel="other_channel")
        await second.migrate()
        await second.aclose()
        args = await sql(
            pg_url,
            "SELECT tgargs FROM pg_trigger WHERE tgname = 'supervisor_desired_notify'",
        )
        assert [bytes(a[0]) for a in args] == [b"other_channel\x00"]


async def test_concurrent_migrations_queue_on_the_advisory_lock(pg_url: str) -> None:
    stores = [make_store(pg_url) for _ in range(4)]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for s in stores:
                nursery.start_soon(s.migrate)
        assert await sql(pg_url, "SELECT count(*) FROM supervisor_schema_migrations") == [
            (migrations.latest_version("postgresql"),)]
        for s in stores:
            await s.aclose()


async def test_unmigrated_database_is_invalid_and_says_to_migrate(pg_url: str) -> None:
    s = make_store(pg_url)
    with trio.fail_after(10):
        with pytest.raises(ControlPlaneError) as info:
            await s.desired()
        await s.aclose()
    assert info.value.category is FailureCategory.INVALID
    assert info.value.reason == reasons.INVALID
    assert not info.value.retryable
    assert "trio-supervisor db migrate" in str(info.value)
    assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)


# -- round trip ------------------------------------------------------------------


async def test_nothing_published_yet(store: RevisionAdmin) -> None:
    with trio.fail_after(10):
        assert await store.desired() is None
        assert await store.hydrate() is None


async def test_publish_desired_hydrate_round_trip(store: RevisionAdmin) -> None:
    body = doc(note="é ünïcode")
    with trio.fail_after(10):
        first = await store.publish(body, 1, "first")
        assert await store.desired() == first
        loaded = await store.hydrate()
        assert loaded is not None
        assert (loaded.id, loaded.schema_version, loaded.body) == (first, 1, body)
        assert (await store.revision(first)).message == "first"
        created_at = (await store.revision(first)).created_at
        assert isinstance(created_at, datetime) and created_at.tzinfo is not None

        second = await store.publish(doc(n=2), 1, None)
        assert second > first
        assert await store.desired() == second
        loaded = await store.hydrate()
        assert loaded is not None
        assert loaded.id == second and (await store.revision(second)).message is None


async def test_publish_stores_the_digest_and_one_desired_row(
    store: RevisionAdmin, pg_url: str
) -> None:
    body = doc()
    with trio.fail_after(10):
        rid = await store.publish(body, 1, "m")
        await store.publish(doc(n=2), 1, "m2")
        rows = await sql(
            pg_url, "SELECT body_sha256 FROM supervisor_revisions WHERE id = %s", (rid,)
        )
        assert bytes(rows[0][0]) == hashlib.sha256(body).digest()
        assert await sql(pg_url, "SELECT count(*) FROM supervisor_desired") == [(1,)]


async def test_concurrent_calls_share_one_connection(store: RevisionAdmin) -> None:
    with trio.fail_after(20):
        rid = await store.publish(doc(), 1, None)
        results: list[int | None] = []

        async def read() -> None:
            results.append(await store.desired())

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(read)
        assert results == [rid] * 20


async def test_a_large_body_round_trips_intact(pg_url: str) -> None:
    big = doc(blob="x" * 3_000_000)
    s = make_store(pg_url)
    with trio.fail_after(30):
        await s.migrate()
        rid = await s.publish(big, 1, None)
        loaded = await s.hydrate()
        await s.aclose()
    assert loaded is not None and loaded.id == rid and loaded.body == big


# -- failure categories from real faults -------------------------------------------


async def test_nothing_listening_is_unavailable_and_the_password_stays_secret() -> None:
    url = f"postgresql://postgres:pw-s3cr3t-%40x@127.0.0.1:{free_port()}/nodb"
    s = make_store(url)
    with trio.fail_after(15):
        for call in (s.desired, s.hydrate):
            with pytest.raises(ControlPlaneError) as info:
                await call()
            err = info.value
            assert err.category is FailureCategory.UNAVAILABLE
            assert err.reason == reasons.UNAVAILABLE and err.retryable
            for text in (str(err), repr(err)):
                assert "s3cr3t" not in text
        await s.aclose()
    assert "s3cr3t" not in repr(s)


TERMINATE_STORE = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND application_name = 'trio-supervisor'"
)


async def test_connection_terminated_while_idle_is_replaced_within_the_call(
    store: RevisionAdmin, pg_url: str
) -> None:
    with trio.fail_after(20):
        rid = await store.publish(doc(), 1, None)
        await sql(pg_url, TERMINATE_STORE)
        assert await store.desired() == rid


async def test_lost_connection_that_cannot_be_replaced_is_unavailable_then_reconnects(
    store: RevisionAdmin, pg_url: str, pg_server: Server
) -> None:
    dbname = pg_url.rpartition("/")[2]
    with trio.fail_after(20):
        rid = await store.publish(doc(), 1, None)
        await sql(pg_server.dsn, f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        try:
            await sql(pg_server.dsn, TERMINATE_STORE.replace("current_database()", f"'{dbname}'"))
            with pytest.raises(ControlPlaneError) as info:
                await store.desired()
            assert info.value.category is FailureCategory.UNAVAILABLE
        finally:
            await sql(pg_server.dsn, f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        assert await store.desired() == rid


async def test_missing_privilege_is_denied(store: RevisionAdmin, pg_url: str,
                                           pg_server: Server) -> None:
    role = f"tsup_noread_{uuid.uuid4().hex[:8]}"
    await sql(pg_server.dsn, f'CREATE ROLE "{role}" LOGIN')
    try:
        with trio.fail_after(15):
            await store.publish(doc(), 1, None)
            base, _, dbname = pg_url.rpartition("/")
            scheme, _, hostpart = base.partition("://")
            host = hostpart.rpartition("@")[2]
            weak = make_store(f"{scheme}://{role}@{host}/{dbname}")
            for call in (weak.desired, weak.hydrate):
                with pytest.raises(ControlPlaneError) as info:
                    await call()
                assert info.value.category is FailureCategory.DENIED
                assert info.value.reason == reasons.DENIED and not info.value.retryable
                assert isinstance(info.value.__cause__, psycopg.errors.InsufficientPrivilege)
            await weak.aclose()
    finally:
        await sql(pg_url, f'DROP OWNED BY "{role}"')
        await sql(pg_server.dsn, f'DROP ROLE "{role}"')


async def test_a_role_that_may_read_only_the_pointer_and_the_revisions_reads(
        store: RevisionAdmin, pg_url: str, pg_server: Server) -> None:
    """What a replica reads is all a replica's role needs: the look at the schema's
    version (a newer build's schema is refused) is skipped where the role may not read
    the migrations table, rather than refusing every read."""
    role = f"tsup_reader_{uuid.uuid4().hex[:8]}"
    await sql(pg_server.dsn, f'CREATE ROLE "{role}" LOGIN')
    try:
        with trio.fail_after(15):
            rid = await store.publish(doc(), 1, None)
            await sql(pg_url, f'GRANT SELECT ON supervisor_revisions, supervisor_desired'
                              f' TO "{role}"')
            base, _, dbname = pg_url.rpartition("/")
            scheme, _, hostpart = base.partition("://")
            host = hostpart.rpartition("@")[2]
            reader = make_store(f"{scheme}://{role}@{host}/{dbname}")
            try:
                pointer = await reader.observe()
                assert pointer is not None and (pointer.revision, pointer.sequence) == (rid, 1)
                loaded = await reader.hydrate()
                assert loaded is not None and loaded.body == doc()
            finally:
                await reader.aclose()
    finally:
        await sql(pg_url, f'DROP OWNED BY "{role}"')
        await sql(pg_server.dsn, f'DROP ROLE "{role}"')


async def test_digest_mismatch_is_corrupt(store: RevisionAdmin, pg_url: str) -> None:
    with trio.fail_after(10):
        rid = await store.publish(doc(), 1, None)
        await sql(pg_url, "UPDATE supervisor_revisions SET body = %s", (doc(tampered=True),))
        with pytest.raises(ControlPlaneError) as info:
            await store.hydrate()
        assert await store.desired() == rid  # the cheap read is unaffected
    err = info.value
    assert (err.category, err.reason, err.revision) == (
        FailureCategory.CORRUPT, reasons.CORRUPT, rid,
    )
    assert not err.retryable


async def test_newer_schema_version_is_incompatible(
    store: RevisionAdmin, pg_url: str
) -> None:
    def publish_v2() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return plain_sql_publish(conn, doc(), schema_version=2)

    with trio.fail_after(10):
        rid = await trio.to_thread.run_sync(publish_v2)
        with pytest.raises(Incompatible) as info:
            await store.hydrate()
    err = info.value
    assert (err.reason, err.revision, err.schema_version) == (reasons.INCOMPATIBLE, rid, 2)
    assert err.category is FailureCategory.DENIED and not err.retryable


async def test_oversize_body_is_too_large_on_publish_and_on_hydrate(pg_url: str) -> None:
    s = make_store(pg_url, max_revision_bytes=1024)
    big = doc(blob="x" * 2000)
    with trio.fail_after(15):
        await s.migrate()
        with pytest.raises(TooLarge) as refused:
            await s.publish(big, 1, None)
        assert refused.value.size == len(big) and refused.value.revision is None
        assert await s.desired() is None  # nothing was stored

        def publish_big() -> int:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                return plain_sql_publish(conn, big)

        rid = await trio.to_thread.run_sync(publish_big)
        with pytest.raises(TooLarge) as info:
            await s.hydrate()
        await s.aclose()
    err = info.value
    assert (err.reason, err.revision, err.size, err.limit) == (
        reasons.DENIED, rid, len(big), 1024,
    )
    assert err.category is FailureCategory.DENIED


async def test_too_large_is_checked_before_incompatible(pg_url: str) -> None:
    s = make_store(pg_url, max_revision_bytes=1024)
    with trio.fail_after(15):
        await s.migrate()

        def publish() -> int:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                return plain_sql_publish(conn, doc(blob="x" * 2000), schema_version=2)

        await trio.to_thread.run_sync(publish)
        with pytest.raises(TooLarge):
            await s.hydrate()
        await s.aclose()


async def test_publish_refuses_a_schema_version_this_build_cannot_read(
    store: RevisionAdmin,
) -> None:
    with trio.fail_after(10):
        with pytest.raises(Incompatible):
            await store.publish(doc(), 2, None)
        with pytest.raises(ControlPlaneError) as info:
            await store.publish(doc(), 0, None)
        assert info.value.category is FailureCategory.INVALID
        assert await store.desired() is None


async def test_desired_pointing_at_a_missing_revision_is_not_found(
    store: RevisionAdmin, pg_url: str
) -> None:
    def point_at_nothing() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
            # Disables the FK's (and every other) trigger for this session only.
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute("INSERT INTO supervisor_desired (revision_id) VALUES (424242)")

    with trio.fail_after(10):
        await trio.to_thread.run_sync(point_at_nothing)
        assert await store.desired() == 424242
        with pytest.raises(ControlPlaneError) as info:
            await store.hydrate()
    err = info.value
    assert (err.category, err.reason, err.revision) == (
        FailureCategory.NOT_FOUND, reasons.NOT_FOUND, 424242,
    )


async def test_statement_timeout_is_unavailable(store: RevisionAdmin, pg_url: str) -> None:
    s = make_store(pg_url, statement_timeout_s=0.3)
    async with hold_lock(pg_url):
        with trio.fail_after(5):
            start = trio.current_time()
            with pytest.raises(ControlPlaneError) as info:
                await s.desired()
            assert trio.current_time() - start < 2.0
    assert info.value.category is FailureCategory.UNAVAILABLE
    assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    with trio.fail_after(5):
        assert await s.desired() is None  # the same connection still works
        await s.aclose()


# -- cancellation ------------------------------------------------------------------


class hold_lock:  # noqa: N801 - reads as a statement in the tests
    """An ACCESS EXCLUSIVE lock on supervisor_desired, held in an open transaction."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: psycopg.Connection[Any] | None = None

    async def __aenter__(self) -> hold_lock:
        def take() -> psycopg.Connection[Any]:
            conn = psycopg.connect(self.url)
            conn.execute("LOCK TABLE supervisor_desired IN ACCESS EXCLUSIVE MODE")
            return conn

        self.conn = await trio.to_thread.run_sync(take)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.conn is not None
        await trio.to_thread.run_sync(self.conn.close)  # rolls back, releasing the lock


async def wait_until(predicate: Callable[[], Awaitable[bool]], interval: float = 0.02) -> None:
    """Poll an external condition (a server view) that no event can signal."""
    while not await predicate():
        await trio.sleep(interval)


async def test_cancelling_a_hung_query_is_prompt_and_the_store_recovers(
    store: RevisionAdmin, pg_url: str
) -> None:
    rid = await store.publish(doc(), 1, None)

    async def no_lock_waiters() -> bool:
        rows = await sql(
            pg_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'trio-supervisor' AND wait_event_type = 'Lock'",
        )
        return bool(rows[0][0] == 0)

    async with hold_lock(pg_url):
        with trio.fail_after(10):
            start = trio.current_time()
            with trio.move_on_after(0.3) as scope:
                await store.desired()  # blocks behind the lock
            elapsed = trio.current_time() - start
            assert scope.cancelled_caught
            assert elapsed < 1.0
            # The server stopped the statement too (it no longer waits for the lock).
            await wait_until(no_lock_waiters)
    with trio.fail_after(10):
        assert await store.desired() == rid


async def test_cancelled_connect_does_not_break_the_store(pg_url: str) -> None:
    with trio.fail_after(15):
        for delay in (0, 0.001, 0.003, 0.005, 0.01, 0.02):
            s = make_store(pg_url)
            with trio.move_on_after(delay):
                await s.migrate()  # cancelled before, during or after its connect
            await s.migrate()
            assert await s.desired() is None
            await s.aclose()


async def test_closed_store_refuses_calls(pg_url: str) -> None:
    s = make_store(pg_url)
    with trio.fail_after(10):
        await s.migrate()
        await s.aclose()
        await s.aclose()  # idempotent
        with pytest.raises(ControlPlaneError):
            await s.desired()


# -- the trigger -----------------------------------------------------------------


async def test_plain_sql_publish_fires_notify_with_the_revision_id(
    store: RevisionAdmin, pg_url: str
) -> None:
    listener = await trio.to_thread.run_sync(
        lambda: psycopg.connect(pg_url, autocommit=True)
    )
    try:
        listener.execute("LISTEN supervisor_desired")

        def publish() -> int:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                return plain_sql_publish(conn, doc())

        with trio.fail_after(10):
            rid = await trio.to_thread.run_sync(publish)
            notes = await trio.to_thread.run_sync(
                lambda: list(listener.notifies(timeout=5, stop_after=1))
            )
            assert [(n.channel, n.payload) for n in notes] == [("supervisor_desired", str(rid))]

            # The store's own publish goes through the same trigger.
            rid2 = await store.publish(doc(n=2), 1, None)
            notes = await trio.to_thread.run_sync(
                lambda: list(listener.notifies(timeout=5, stop_after=1))
            )
            assert [n.payload for n in notes] == [str(rid2)]
    finally:
        listener.close()


async def test_store_is_a_postgres_store(store: RevisionAdmin) -> None:
    assert isinstance(store, PostgresStore)






async def test_a_role_that_may_only_read_is_denied_each_write_and_the_change_record(
        store: RevisionAdmin, pg_url: str, pg_server: Server) -> None:
    role = f"tsup_select_{uuid.uuid4().hex[:8]}"
    await sql(pg_server.dsn, f'CREATE ROLE "{role}" LOGIN')
    try:
        with trio.fail_after(30):
            rid = await store.publish(doc(), 1, "first")
            await sql(pg_url, f'GRANT SELECT ON supervisor_revisions, supervisor_desired'
                              f' TO "{role}"')
            base, _, dbname = pg_url.rpartition("/")
            scheme, _, hostpart = base.partition("://")
            reader = make_store(f"{scheme}://{role}@{hostpart.rpartition('@')[2]}/{dbname}")
            try:
                desired, rows = await reader.history(None)
                assert desired == rid and [r.id for r in rows] == [rid]
                calls = (lambda: reader.publish(doc(n=2), 1, None), lambda: reader.prune(0),
                         lambda: reader.rollback(rid, hashlib.sha256(doc()).digest()),
                         lambda: reader.changes(None))
                for call in calls:
                    with pytest.raises(ControlPlaneError) as info:
                        await call()
                    assert info.value.category is FailureCategory.DENIED
                    assert not info.value.retryable
                    assert isinstance(info.value.__cause__, psycopg.errors.InsufficientPrivilege)
            finally:
                await reader.aclose()
            assert len(await store.changes(None)) == 1
    finally:
        await sql(pg_url, f'DROP OWNED BY "{role}"')
        await sql(pg_server.dsn, f'DROP ROLE "{role}"')
