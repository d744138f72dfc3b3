"""Shared by the store tests: a minimal revision body, a store for a URL, a lock wait."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.factory import open_admin
from supervisor.controlplane.store import RevisionAdmin
from tests.polling import poll_until


def doc(**extra: Any) -> bytes:
    return json.dumps({"schema_version": 1, "aliases": {}, **extra}).encode()


def make_store(url: str, **cp: Any) -> RevisionAdmin:
    statement_timeout_s = cp.pop("statement_timeout_s", 10.0)
    return open_admin(
        ControlPlaneConfig(url=url, **cp), max_schema_version=1,
        statement_timeout_s=statement_timeout_s,
    )


async def waits_on_the_desired_row(pg_url: str) -> None:
    """Until another session waits on a lock in a statement on supervisor_desired (outside
    state, polled; the caller bounds the wait)."""
    with psycopg.connect(pg_url, autocommit=True) as watch:
        await poll_until(lambda: bool(watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type"
            " = 'Lock' AND query LIKE '%%supervisor_desired%%'"
        ).fetchone()[0]))  # type: ignore[index]
