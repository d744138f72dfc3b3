"""Faults a test puts on its own PostgreSQL database: settings, roles, grants.

Every setting goes on the test's own database (``ALTER DATABASE``), so it
reaches every new session of the daemon and nothing outside the test.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import trio


def _run(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query.encode())
        return cur.fetchall() if cur.description else []


async def sql(url: str, query: str) -> list[tuple[Any, ...]]:
    """One statement on a fresh autocommit connection, off the trio thread."""
    return await trio.to_thread.run_sync(_run, url, query)


def dbname(url: str) -> str:
    return url.rpartition("/")[2]


async def alter_database(url: str, setting: str, value: str) -> None:
    """``setting = value`` for every new session of the test's own database."""
    await sql(url, f"ALTER DATABASE \"{dbname(url)}\" SET {setting} = '{value}'")


@asynccontextmanager
async def login_role(url: str) -> AsyncIterator[tuple[str, str]]:
    """A new login role that may read and write the supervisor tables: (role, its DSN).

    Made after ``db migrate`` (grants on existing tables); dropped at the end.
    """
    role = f"tsup_role_{uuid.uuid4().hex[:8]}"
    # Roles belong to the cluster: any of its databases can make and drop them.
    await sql(url, f'CREATE ROLE "{role}" LOGIN')
    await sql(url, f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"')
    await sql(url, f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    scheme, _, rest = url.partition("://")
    hostpart = rest.rpartition("@")[2]
    try:
        yield role, f"{scheme}://{role}@{hostpart}"
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await sql(url, f'DROP OWNED BY "{role}"')
            await sql(url, f'DROP ROLE IF EXISTS "{role}"')
