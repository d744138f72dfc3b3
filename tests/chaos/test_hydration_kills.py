"""The daemon's database backends are terminated, over and over, while large revisions land."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from tests.chaos.support import (
    chaos_config,
    count_lines,
    get_json,
    publish_once,
    revision_body,
    snapshot_file_at,
    sql_publish,
    stop_within_grace,
    tag_of,
)
from tests.proc import acli, run_daemon

# The readers below sample the daemon's output continuously during the fault;
# this is their sampling cadence, not a wait for something to happen.
SAMPLE_EVERY_S = 0.01

pytestmark = pytest.mark.chaos

ALIASES = 20_000  # about 1.5 MB of JSON: hydrated in one read, compiled in a worker thread
REVISIONS = 12


def _observe(observations: list[tuple[int, frozenset[str], int]], data: dict[str, Any]) -> None:
    observations.append((int(data["revision"]), frozenset(tag_of(data)), len(data["aliases"])))


async def test_backends_killed_during_hydration_never_half_apply(
    tmp_path: Path, pg_url: str
) -> None:
    """``pg_terminate_backend`` of every daemon connection in a loop while publishing.

    Must not be lost: the integrity of what is served. Every snapshot the file
    and ``GET /v1/snapshot`` ever show parses, has all of its revision's aliases
    and only that revision's content (never a mix, never a truncation); and once
    the killing stops, the daemon converges to the last published revision.
    """
    snapshot = tmp_path / "snapshot.json"
    config, port = chaos_config(tmp_path, pg_url, poll_interval_s=0.05,
                                extra=f'[snapshot]\npath = "{snapshot}"\n')
    base = f"http://127.0.0.1:{port}"
    await acli("db", "migrate", "--config", str(config))
    published: dict[int, str] = {}
    first = await trio.to_thread.run_sync(publish_once, pg_url, revision_body(ALIASES, "t0"))
    published[first] = "t0"
    file_seen: list[tuple[int, frozenset[str], int]] = []
    http_seen: list[tuple[int, frozenset[str], int]] = []
    stop_killing = threading.Event()
    kills: list[int] = []

    def killer() -> None:
        rng = random.Random(7)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            while not stop_killing.is_set():
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = 'trio-supervisor'"
                    " AND pid <> pg_backend_pid()").fetchall()
                kills.append(sum(1 for (ok,) in rows if ok))
                stop_killing.wait(rng.uniform(0.002, 0.03))

    def publisher() -> None:
        rng = random.Random(11)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for k in range(1, REVISIONS + 1):
                tag = f"t{k}"
                body = revision_body(ALIASES, tag)
                published[sql_publish(conn, body)] = tag
                stop_killing.wait(rng.uniform(0.05, 0.3))

    with trio.fail_after(120):
        async with run_daemon(config) as daemon, httpx.AsyncClient(timeout=10) as http:
            await daemon.wait_log("ready")
            done = trio.Event()

            async def read_file() -> None:
                while not done.is_set():
                    data = await trio.to_thread.run_sync(snapshot.read_bytes)
                    _observe(file_seen, json.loads(data))
                    await trio.sleep(SAMPLE_EVERY_S)

            async def read_http() -> None:
                while not done.is_set():
                    code, data, etag = await get_json(http, f"{base}/v1/snapshot")
                    assert code == 200
                    assert etag == f'"{data["revision"]}-{data["generation"]}"'
                    _observe(http_seen, data)
                    await trio.sleep(SAMPLE_EVERY_S)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_file)
                nursery.start_soon(read_http)
                kill_thread = threading.Thread(target=killer, daemon=True)
                kill_thread.start()
                try:
                    await trio.to_thread.run_sync(publisher)
                finally:
                    stop_killing.set()
                    await trio.to_thread.run_sync(kill_thread.join)
                last = max(published)
                await daemon.wait_log("published", revision=last)
                done.set()
            code, data, _ = await get_json(http, f"{base}/v1/snapshot")
            assert code == 200 and data["revision"] == last
            assert tag_of(data) == {published[last]} and len(data["aliases"]) == ALIASES
            assert await snapshot_file_at(snapshot, last) == data
            failures = count_lines(daemon, "control plane unreachable", reason="unavailable")
            await stop_within_grace(daemon, 5.0)

    print(f"kills={sum(kills)} failures={failures} file_reads={len(file_seen)} http_reads={len(http_seen)} revisions_seen={sorted({r for r, _, _ in file_seen})}")
    assert sum(kills) > 0, "the drill terminated no backend"
    assert failures > 0, "no convergence attempt was interrupted"
    assert file_seen and http_seen
    for revision, tags, count in file_seen + http_seen:
        assert revision in published, f"served revision {revision} was never published"
        assert tags == {published[revision]}, (revision, tags)
        assert count == ALIASES, (revision, count)
