"""The embedded SQLite store: same round trips, checks and categories as PostgreSQL."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest
import trio

from supervisor import reasons
from supervisor.config import sqlite_path
from supervisor.controlplane import migrations
from supervisor.controlplane.errors import (
    ControlPlaneError,
    FailureCategory,
    Incompatible,
    TooLarge,
)
from supervisor.controlplane.sqlite import SQLiteStore
from supervisor.controlplane.store import RevisionAdmin
from tests.needs import missing
from tests.stores import doc, make_store


def raw(url: str) -> sqlite3.Connection:
    """A second, independent connection to the same file (foreign keys off, the default)."""
    return sqlite3.connect(sqlite_path(url), isolation_level=None)


def plain_sql_publish(url: str, body: bytes | str, schema_version: int = 1) -> int:
    with raw(url) as conn:
        digest = hashlib.sha256(body.encode() if isinstance(body, str) else body).digest()
        cur = conn.execute(
            "INSERT INTO supervisor_revisions (schema_version, body, body_sha256) VALUES (?, ?, ?)",
            (schema_version, body, digest),
        )
        rid = cur.lastrowid
        assert rid is not None
        conn.execute(
            "INSERT INTO supervisor_desired (singleton, revision_id) VALUES (TRUE, ?)"
            " ON CONFLICT (singleton) DO UPDATE SET revision_id = excluded.revision_id",
            (rid,),
        )
    return rid


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[RevisionAdmin]:
    s = make_store(sqlite_url)
    yield s
    with trio.fail_after(5):
        await s.aclose()


async def test_migrates_on_open_and_migrating_again_is_harmless(sqlite_url: str) -> None:
    s = make_store(sqlite_url)
    with trio.fail_after(10):
        assert await s.desired() is None  # the first call opened and migrated the file
        rid = await s.publish(doc(), 1, None)
        await s.migrate()
        await s.migrate()
        assert await s.desired() == rid
        await s.aclose()
    with raw(sqlite_url) as conn:
        assert conn.execute("SELECT version FROM supervisor_schema_migrations"
                            " ORDER BY version").fetchall() == [(1,), (2,), (3,)]


async def test_round_trip(store: RevisionAdmin) -> None:
    assert isinstance(store, SQLiteStore)
    body = doc(note="é ünïcode")
    with trio.fail_after(10):
        assert await store.hydrate() is None
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
        loaded = await store.hydrate()
        assert loaded is not None and loaded.id == second
        assert (await store.revision(second)).message is None


async def test_plain_sql_publish_with_a_text_body_is_read_as_utf8(
    store: RevisionAdmin, sqlite_url: str
) -> None:
    with trio.fail_after(10):
        await store.migrate()
        text = doc(note="ü").decode()
        rid = plain_sql_publish(sqlite_url, text)
        loaded = await store.hydrate()
    assert loaded is not None and loaded.id == rid and loaded.body == text.encode()


async def test_digest_mismatch_is_corrupt(store: RevisionAdmin, sqlite_url: str) -> None:
    with trio.fail_after(10):
        rid = await store.publish(doc(), 1, None)
        with raw(sqlite_url) as conn:
            conn.execute("UPDATE supervisor_revisions SET body = ?", (doc(tampered=True),))
        with pytest.raises(ControlPlaneError) as info:
            await store.hydrate()
    assert (info.value.category, info.value.reason, info.value.revision) == (
        FailureCategory.CORRUPT, reasons.CORRUPT, rid,
    )


async def test_newer_schema_version_is_incompatible(
    store: RevisionAdmin, sqlite_url: str
) -> None:
    with trio.fail_after(10):
        await store.migrate()
        rid = plain_sql_publish(sqlite_url, doc(), schema_version=2)
        with pytest.raises(Incompatible) as info:
            await store.hydrate()
    assert (info.value.reason, info.value.revision, info.value.schema_version) == (
        reasons.INCOMPATIBLE, rid, 2,
    )


async def test_oversize_is_too_large(sqlite_url: str) -> None:
    s = make_store(sqlite_url, max_revision_bytes=1024)
    big = doc(blob="x" * 2000)
    with trio.fail_after(10):
        with pytest.raises(TooLarge):
            await s.publish(big, 1, None)
        assert await s.desired() is None
        rid = plain_sql_publish(sqlite_url, big)
        with pytest.raises(TooLarge) as info:
            await s.hydrate()
        await s.aclose()
    assert (info.value.reason, info.value.revision, info.value.size) == (
        reasons.DENIED, rid, len(big),
    )


async def test_desired_pointing_at_a_missing_revision_is_not_found(
    store: RevisionAdmin, sqlite_url: str
) -> None:
    with trio.fail_after(10):
        await store.migrate()
        with raw(sqlite_url) as conn:  # foreign keys are off on this connection
            conn.execute("INSERT INTO supervisor_desired (singleton, revision_id) VALUES (1, 99)")
        with pytest.raises(ControlPlaneError) as info:
            await store.hydrate()
    assert (info.value.category, info.value.reason, info.value.revision) == (
        FailureCategory.NOT_FOUND, reasons.NOT_FOUND, 99,
    )


async def test_foreign_keys_are_enforced_on_the_store_connection(store: RevisionAdmin) -> None:
    # The store's own connection turns foreign keys on; prove it through a
    # publish whose desired row could only dangle if they were off.
    with trio.fail_after(10):
        rid = await store.publish(doc(), 1, None)
        assert await store.desired() == rid


async def test_missing_directory_is_unavailable(tmp_path: Path) -> None:
    s = make_store(f"sqlite:///{tmp_path}/no/such/dir/cp.db")
    with trio.fail_after(10):
        with pytest.raises(ControlPlaneError) as info:
            await s.desired()
        await s.aclose()
    assert info.value.category is FailureCategory.UNAVAILABLE and info.value.retryable


async def test_a_directory_in_place_of_the_file_is_unavailable(tmp_path: Path) -> None:
    # Unreadable whatever the privileges (the tests may run as root, which
    # ignores file modes).
    (tmp_path / "cp.db").mkdir()
    s = make_store(f"sqlite:///{tmp_path}/cp.db")
    with trio.fail_after(10):
        with pytest.raises(ControlPlaneError) as info:
            await s.desired()
        await s.aclose()
    assert info.value.category is FailureCategory.UNAVAILABLE


async def test_a_file_that_is_not_a_database_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    path.write_bytes(os.urandom(8192))
    s = make_store(f"sqlite:///{path}")
    with trio.fail_after(10):
        with pytest.raises(ControlPlaneError) as info:
            await s.desired()
        await s.aclose()
    assert info.value.category is FailureCategory.CORRUPT


async def test_store_recovers_when_the_file_becomes_usable(tmp_path: Path) -> None:
    s = make_store(f"sqlite:///{tmp_path}/later/cp.db")
    with trio.fail_after(10):
        with pytest.raises(ControlPlaneError):
            await s.desired()
        (tmp_path / "later").mkdir()
        assert await s.desired() is None
        await s.aclose()


async def test_write_lock_held_elsewhere_is_conflict(sqlite_url: str) -> None:
    s = make_store(sqlite_url, statement_timeout_s=0.4)  # busy timeout 0.2 s
    with trio.fail_after(10):
        await s.migrate()
        with raw(sqlite_url) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(ControlPlaneError) as info:
                await s.publish(doc(), 1, None)
            assert await s.desired() is None  # WAL: readers are not blocked by the writer
            other.execute("ROLLBACK")
        assert info.value.category is FailureCategory.CONFLICT and info.value.retryable
        rid = await s.publish(doc(), 1, None)
        assert await s.desired() == rid
        await s.aclose()


async def test_cancelling_a_blocked_write_is_prompt_and_the_store_recovers(
    sqlite_url: str,
) -> None:
    s = make_store(sqlite_url, statement_timeout_s=20)  # busy timeout 10 s
    with trio.fail_after(10):
        await s.migrate()
        other = raw(sqlite_url)
        other.execute("BEGIN IMMEDIATE")
        start = trio.current_time()
        with trio.move_on_after(0.2) as scope:
            await s.publish(doc(), 1, None)
        assert scope.cancelled_caught
        assert trio.current_time() - start < 1.0
        other.execute("ROLLBACK")
        other.close()
        rid = await s.publish(doc(), 1, None)
        assert await s.desired() == rid
        await s.aclose()
    # The cancelled publish stopped waiting for the lock: it never committed.
    with raw(sqlite_url) as conn:
        assert conn.execute("SELECT count(*) FROM supervisor_revisions").fetchone() == (1,)


async def test_closed_store_refuses_calls(sqlite_url: str) -> None:
    s = make_store(sqlite_url)
    with trio.fail_after(10):
        await s.migrate()
        await s.aclose()
        with pytest.raises(ControlPlaneError):
            await s.desired()


def test_an_older_schema_in_a_read_only_file_is_refused_naming_db_migrate(
        sqlite_url: str) -> None:
    """A replica may read the file without write access; then it cannot upgrade it either,
    and 'attempt to write a readonly database' would not say why it tried."""
    path = sqlite_path(sqlite_url)
    with sqlite3.connect(path) as conn:
        for statement in migrations._sqlite_statements(
                migrations.load_migrations("sqlite")[0].sql):
            conn.execute(statement)
        conn.execute(f"CREATE TABLE {migrations.MIGRATIONS_TABLE} (version INTEGER"
                     " PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT)")
        conn.execute(f"INSERT INTO {migrations.MIGRATIONS_TABLE} VALUES (1, 'initial', '')")
    read_only = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    try:
        with pytest.raises(ControlPlaneError) as refused:
            migrations.migrate_sqlite(read_only)
    finally:
        read_only.close()
    assert refused.value.category is FailureCategory.INVALID
    latest = migrations.latest_version("sqlite")
    assert f"is version 1, older than this build's {latest}" in str(refused.value)
    assert "db migrate" in str(refused.value) and "read-only" in str(refused.value)
    with raw(sqlite_url) as conn:
        assert conn.execute(f"SELECT max(version) FROM {migrations.MIGRATIONS_TABLE}"
                            ).fetchall() == [(1,)]







async def test_a_read_only_file_is_read_and_each_write_is_denied(sqlite_url: str) -> None:
    """A replica's file it may not write: reads answer, writes are DENIED (not retried)."""
    path = sqlite_path(sqlite_url)
    writer = make_store(sqlite_url)
    with trio.fail_after(30):
        rid = await writer.publish(doc(), 1, "first")
        await writer.aclose()
    if os.geteuid() == 0:  # root writes through a mode; an immutable file it cannot
        if subprocess.run(["chattr", "+i", path], capture_output=True).returncode:
            missing("chattr +i on the test's file system (root writes through a mode)",
                    "run as a non-root user, or with a temporary directory on ext4 or xfs")
        undo = ["chattr", "-i", path]
    else:
        os.chmod(path, 0o444)
        undo = ["chmod", "0644", path]
    reader = make_store(sqlite_url)
    try:
        with trio.fail_after(30):
            assert await reader.desired() == rid
            assert (await reader.history(None))[0] == rid
            assert [c.message for c in await reader.changes(None)] == ["first"]
            writes = (lambda: reader.publish(doc(n=2), 1, None), lambda: reader.prune(0),
                      lambda: reader.rollback(rid, hashlib.sha256(doc()).digest()))
            for write in writes:
                with pytest.raises(ControlPlaneError) as info:
                    await write()
                assert info.value.category is FailureCategory.DENIED
                assert not info.value.retryable
            assert await reader.desired() == rid
    finally:
        await reader.aclose()
        subprocess.run(undo, check=True)


async def test_prune_under_a_pointer_that_is_no_revision_id_is_corrupt_and_deletes_nothing(
        store: RevisionAdmin, sqlite_url: str) -> None:
    """A plain-SQL writer (foreign keys off) left text in the pointer: prune cannot tell
    which revision is desired, so it refuses, as the pointer's other readers do."""
    with trio.fail_after(30):
        ids = [await store.publish(doc(n=n), 1, None) for n in range(3)]
        with raw(sqlite_url) as conn:
            conn.execute("UPDATE supervisor_desired SET revision_id = 'abc'")
        for call in (lambda: store.prune(1), lambda: store.history(None), store.desired):
            with pytest.raises(ControlPlaneError) as info:
                await call()
            assert info.value.category is FailureCategory.CORRUPT
    with raw(sqlite_url) as conn:
        assert [r[0] for r in conn.execute("SELECT id FROM supervisor_revisions"
                                           " ORDER BY id")] == ids
