"""Shared fixtures: a fresh PostgreSQL database per test, process helpers.

PostgreSQL is the real server on 127.0.0.1:5432 (trust auth, user postgres),
overridable with ``SUPERVISOR_TEST_PG`` (a DSN to the maintenance database).
In CI (``CI=true``) an unreachable server fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

ADMIN_DSN = os.environ.get("SUPERVISOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {ADMIN_DSN}: {exc}")


def _dsn_for(dbname: str) -> str:
    base, _, _ = ADMIN_DSN.rpartition("/")
    return f"{base}/{dbname}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A DSN to a new, empty database, dropped after the test."""
    name = f"tsup_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _dsn_for(name)
    finally:
        with _admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    return f"sqlite:///{os.fspath(tmp_path)}/controlplane.db"
