"""``db migrate`` says what it did, and a schema migrated by a newer build is refused.

Through the real CLI on both control planes: ``created schema version N``,
``upgraded schema from N to M``, ``schema up to date (version N)``; a
database whose recorded migrations go beyond this build's is refused by
``db migrate``, ``check``, ``publish`` and ``run`` with exit 2 and a message
naming both versions, and nothing in it is changed.
"""

from __future__ import annotations

import socket
import sqlite3
import time
from pathlib import Path

import psycopg
import pytest
import trio

from supervisor.controlplane import migrations
from supervisor.controlplane.errors import ControlPlaneError, SchemaTooNew
from tests.proc import cli, write_config
from tests.stores import make_store, waits_on_the_desired_row

LATEST = migrations.latest_version("sqlite")
FUTURE = LATEST + 7


@pytest.fixture(params=["postgresql", "sqlite"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_url" if request.param == "postgresql"
                                       else "sqlite_url"))


def _sql(url: str, statement: str) -> list[tuple[object, ...]]:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return conn.execute(statement).fetchall()
    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(statement.encode())
        return cur.fetchall() if cur.description else []


def _create_version_1(url: str) -> None:
    backend = "postgresql" if url.startswith("postgresql") else "sqlite"
    v1 = migrations.load_migrations(backend)[0]
    if backend == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            for statement in migrations._sqlite_statements(v1.sql):
                conn.execute(statement)
    else:
        _sql(url, v1.sql)
    _sql(url, f"CREATE TABLE {migrations.MIGRATIONS_TABLE} (version integer PRIMARY KEY,"
              " name text NOT NULL, applied_at text)")
    _sql(url, f"INSERT INTO {migrations.MIGRATIONS_TABLE} VALUES (1, 'initial', 'then')")


def test_migrate_says_created_then_up_to_date(tmp_path: Path, url: str) -> None:
    config = write_config(tmp_path, url)
    first = cli("db", "migrate", "--config", str(config))
    assert first.stdout.startswith(f"created schema version {LATEST}: ")
    again = cli("db", "migrate", "--config", str(config))
    assert again.stdout.startswith(f"schema up to date (version {LATEST}): ")


def test_migrate_says_it_upgraded_an_older_schema(tmp_path: Path, url: str) -> None:
    _create_version_1(url)
    config = write_config(tmp_path, url)
    done = cli("db", "migrate", "--config", str(config))
    assert done.stdout.startswith(f"upgraded schema from 1 to {LATEST}: ")
    assert _sql(url, f"SELECT max(version) FROM {migrations.MIGRATIONS_TABLE}") == [(LATEST,)]


def test_a_schema_from_a_newer_build_is_refused_by_every_command(
        tmp_path: Path, url: str) -> None:
    config = write_config(tmp_path, url)
    cli("db", "migrate", "--config", str(config))
    revision = tmp_path / "rev.toml"
    revision.write_text('schema_version = 1\n[aliases]\n')
    cli("publish", "--config", str(config), str(revision))
    _sql(url, f"INSERT INTO {migrations.MIGRATIONS_TABLE} (version, name, applied_at)"
              f" VALUES ({FUTURE}, 'from_the_future', 'now')")
    before = _sql(url, "SELECT count(*) FROM supervisor_revisions")
    for args in (("db", "migrate"), ("check",), ("publish", str(revision)), ("run",)):
        result = cli(*args, "--config", str(config), check=False, timeout=60)
        said = result.stdout + result.stderr
        assert result.returncode == 2, (args, said)
        assert f"version {FUTURE}" in said and f"version {LATEST}" in said, (args, said)
    assert _sql(url, "SELECT count(*) FROM supervisor_revisions") == before
    assert _sql(url, f"SELECT max(version) FROM {migrations.MIGRATIONS_TABLE}") == [(FUTURE,)]


def test_check_looks_at_a_silent_postgresql_for_two_seconds_at_most(tmp_path: Path) -> None:
    """A server that takes the connection and never answers, named twice, with a DSN of
    its own connect_timeout: check's look at the schema gives up, whatever libpq would do
    (10 s per host here), and the configuration itself is fine."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        config = write_config(tmp_path, f"postgresql://postgres@127.0.0.1:{port},"
                                        f"127.0.0.1:{port}/cp?connect_timeout=10")
        began = time.monotonic()
        result = cli("check", "--config", str(config), check=False, timeout=120)
        took = time.monotonic() - began
    assert result.returncode == 0, result.stderr
    assert took < 8, f"check took {took:.1f} s"  # Python's start is about 1.5 s of it


async def test_a_migration_behind_an_open_transaction_gives_way_to_the_readers(
        pg_url: str) -> None:
    """ALTER TABLE queues every later reader of the table behind its lock: behind a
    session idle in a transaction, it would stall every replica's reads until their
    statement timeout and then fail for a reason that names nothing."""
    _create_version_1(pg_url)
    with trio.fail_after(60):
        migrator = make_store(pg_url, statement_timeout_s=20.0)
        with psycopg.connect(pg_url) as idle:
            idle.execute("SELECT revision_id FROM supervisor_desired").fetchall()
            try:
                async with trio.open_nursery() as nursery:
                    refusal: list[ControlPlaneError] = []

                    async def migrate() -> None:
                        with pytest.raises(ControlPlaneError) as refused:
                            await migrator.migrate()
                        refusal.append(refused.value)

                    nursery.start_soon(migrate)
                    await waits_on_the_desired_row(pg_url)

                    def read() -> object:
                        # A replica's read, bounded as the stores bound theirs.
                        with psycopg.connect(pg_url) as replica:
                            replica.execute("SET LOCAL statement_timeout = '5s'")
                            return replica.execute(
                                "SELECT revision_id FROM supervisor_desired").fetchall()

                    assert await trio.to_thread.run_sync(read) == []
            finally:
                await migrator.aclose()
        assert "lock" in str(refusal[0]) and "idle in transaction" in str(refusal[0])
    assert _sql(pg_url, f"SELECT max(version) FROM {migrations.MIGRATIONS_TABLE}") == [(1,)]


async def test_a_schema_migrated_ahead_is_refused_at_the_next_observe(url: str) -> None:
    """On the connection already open: not only after a reconnect."""
    store = make_store(url)
    try:
        with trio.fail_after(30):
            await store.migrate()
            await store.publish(b'{"schema_version": 1, "aliases": {}}', 1, None)
            assert await store.observe() is not None
            _sql(url, f"INSERT INTO {migrations.MIGRATIONS_TABLE} (version, name, applied_at)"
                      f" VALUES ({FUTURE}, 'from_the_future', 'now')")
            with pytest.raises(SchemaTooNew) as refused:
                await store.observe()
            assert f"version {FUTURE}" in str(refused.value)
    finally:
        await store.aclose()


def test_a_schema_older_than_the_build_is_refused_before_any_write(
        tmp_path: Path, url: str) -> None:
    _create_version_1(url)
    config = write_config(tmp_path, url)
    revision = tmp_path / "rev.toml"
    revision.write_text('schema_version = 1\n[aliases]\n')
    desired = _sql(url, "SELECT * FROM supervisor_desired")
    for args in (("publish", str(revision)), ("rollback", "1"), ("db", "prune", "--keep", "0"),
                 ("check",)):
        result = cli(*args, "--config", str(config), check=False, timeout=60)
        said = result.stdout + result.stderr
        assert result.returncode == 2, (args, said)
        assert "db migrate" in said and f"version 1, older than this build's {LATEST}" in said, \
            (args, said)
        assert "configuration OK" not in said
    assert _sql(url, "SELECT * FROM supervisor_desired") == desired
    assert _sql(url, "SELECT count(*) FROM supervisor_revisions") == [(0,)]
    assert _sql(url, f"SELECT max(version) FROM {migrations.MIGRATIONS_TABLE}") == [(1,)]
