"""A compressed soak: 1,000 publishes, each converged, with ten stream clients reading."""

from __future__ import annotations

import statistics
from pathlib import Path

import httpx
import psycopg
import pytest
import trio

from tests.chaos.support import (
    chaos_config,
    metric,
    revision_body,
    rss_kib,
    sql_publish,
    stop_within_grace,
    stream_clients,
)
from tests.proc import acli, run_daemon

pytestmark = pytest.mark.chaos

PUBLISHES = 1_000
WARMUP = 100
CLIENTS = 10
MAX_GROWTH_KIB = 10 * 1024


async def test_thousand_publishes_with_ten_stream_clients(tmp_path: Path, pg_url: str) -> None:
    """LISTEN on, poll 0.05 s: 1,000 revisions published one after the other, the next one
    as soon as the previous one reached a stream client.

    Must not be lost: memory (RSS after a warm-up of 100 publishes and at the end
    differ by less than 10 MB: nothing accumulates per revision, per event or per
    generation), and events (every client saw every revision published, in order,
    ending with the last; none was dropped as too slow).
    """
    config, port = chaos_config(tmp_path, pg_url, poll_interval_s=0.05, listen=True)
    base = f"http://127.0.0.1:{port}"
    await acli("db", "migrate", "--config", str(config))
    conn = await trio.to_thread.run_sync(lambda: psycopg.connect(pg_url, autocommit=True))
    published: list[int] = []
    samples: list[int] = []
    try:
        published.append(await trio.to_thread.run_sync(
            sql_publish, conn, revision_body(20, "w0")))
        with trio.fail_after(300):
            async with run_daemon(config) as daemon, httpx.AsyncClient(timeout=5) as http:
                await daemon.wait_log("ready")
                pid = daemon.process.pid
                async with stream_clients(port, CLIENTS) as clients:
                    start = trio.current_time()
                    for k in range(1, PUBLISHES + 1):
                        rid = await trio.to_thread.run_sync(
                            sql_publish, conn, revision_body(20, f"w{k}"))
                        published.append(rid)
                        await clients[k % CLIENTS].wait_published(rid)
                        if k == WARMUP:
                            baseline = rss_kib(pid)
                        if k % 50 == 0:
                            samples.append(rss_kib(pid))
                    elapsed = trio.current_time() - start
                    last = published[-1]
                    for client in clients:
                        await client.wait_published(last)
                    final = rss_kib(pid)
                    metrics = (await http.get(f"{base}/metrics")).text
                    status = (await http.get(f"{base}/status")).json()["revision"]
                    await stop_within_grace(daemon, 5.0)
    finally:
        await trio.to_thread.run_sync(conn.close)

    print(f"{PUBLISHES} publishes in {elapsed:.1f} s ({PUBLISHES / elapsed:.0f}/s);"
          f" RSS after warm-up {baseline / 1024:.1f} MB, end {final / 1024:.1f} MB,"
          f" median {statistics.median(samples) / 1024:.1f} MB, max {max(samples) / 1024:.1f} MB")
    assert status["active"] == last and status["lag_s"] == 0
    assert metric(metrics, "supervisor_stream_dropped_clients_total") == 0
    for client in clients:
        # Each publish was converged before the next one was made, so each is its
        # own "published" event: every client saw all of them, in order.
        assert client.published == published[1:]
    assert final - baseline < MAX_GROWTH_KIB, (
        f"RSS grew {(final - baseline) / 1024:.1f} MB over {PUBLISHES - WARMUP} publishes")
