"""Liveness that means something (issue 10, Deliver 2), through the real daemon process.

The stall rule: ``/healthz`` answers 503 naming the stall, and ``WATCHDOG=1``
stops, while the convergence loop has not finished an attempt for longer than
``3 * poll_interval_s + backoff_max_s``. Here the limit is 0.04 s and a real
attempt outlasts it many times over: a ~12 MB revision whose one key names a secret that is
never set takes well over a second to hydrate and compile before it is
refused, and it is retried at every poll. Once a good revision is published,
attempts are quick again: 200, and the pings resume.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.integration.test_memory_process import big_body, failures
from tests.polling import POLL_INTERVAL_S, poll_until
from tests.proc import EXAMPLE, NotifySocket, acli, free_port, run_daemon, write_config

STALL = "convergence has not finished an attempt for"


def publish(db: Path, data: bytes) -> int:
    with sqlite3.connect(db) as conn:
        rid = conn.execute(
            "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
            " VALUES (1, ?, ?)", (data, hashlib.sha256(data).digest())).lastrowid
        conn.execute("UPDATE supervisor_desired SET revision_id = ?", (rid,))
    assert rid is not None
    return rid


def sample_health(port: int, seen: list[tuple[float, int, Any]], stop: threading.Event) -> None:
    with httpx.Client(timeout=5.0) as client:
        while not stop.is_set():
            try:
                response = client.get(f"http://127.0.0.1:{port}/healthz")
                seen.append((time.monotonic(), response.status_code, response.json()))
            except httpx.TransportError:
                pass
            stop.wait(POLL_INTERVAL_S)


async def test_a_stalled_convergence_loop_is_unhealthy_and_stops_the_watchdog(
        tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "cp.db"
    config = write_config(tmp_path, f"sqlite:///{db}", port=port, poll_interval_s=0.01,
                          backoff_initial_s=0.01, backoff_max_s=0.01)
    await acli("publish", "--config", str(config), str(EXAMPLE))
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "200000"}  # a ping each 0.1 s
    big = big_body(12 * 1024 * 1024)
    seen: list[tuple[float, int, Any]] = []
    pings: list[float] = []
    stop = threading.Event()
    with trio.fail_after(120):
        async with run_daemon(config, env=env) as daemon, trio.open_nursery() as nursery:
            await notify.wait_for("READY=1")

            async def pump() -> None:
                while True:
                    if "WATCHDOG=1" in await notify.receive():
                        pings.append(time.monotonic())

            async def sample() -> None:
                try:
                    await trio.to_thread.run_sync(sample_health, port, seen, stop)
                finally:
                    stop.set()

            nursery.start_soon(pump)
            nursery.start_soon(sample)
            try:
                await scenario(daemon, port, db, big, seen, pings)
            finally:
                stop.set()
                nursery.cancel_scope.cancel()
    notify.close()


async def scenario(daemon: Any, port: int, db: Path, big: bytes,
                   seen: list[tuple[float, int, Any]], pings: list[float]) -> None:
    """Healthy, stalled by the big refusal (503, no pings), healed by a good publish."""
    await poll_until(lambda: any(code == 200 for _, code, _ in seen))
    await trio.to_thread.run_sync(publish, db, big)
    await daemon.wait_log("revision refused; previous snapshot keeps serving",
                          reason="secret")
    # Ten more refusals, each a long attempt (the secret is retried every poll).
    stalled_from = time.monotonic()
    first = await failures(port)

    async def ten_more() -> bool:
        return await failures(port) >= first + 10

    await poll_until(ten_more)
    stalled_until = time.monotonic()
    unhealthy = [b for t, code, b in seen if code == 503 and t >= stalled_from]
    assert unhealthy, "/healthz never answered 503 while the loop stalled"
    assert all(any(reason.startswith(STALL) for reason in b["unhealthy"])
               for b in unhealthy), unhealthy
    # Each attempt that finishes leaves the loop healthy for the 0.04 s of the limit, and
    # a ping may fall in that gap (about 0.4 of the attempts on an idle machine, where an
    # attempt takes ~0.2 s): so not none, but far fewer than a healthy daemon's one each
    # 0.1 s (which the same window gets with the stall rule removed).
    during = [t for t in pings if stalled_from <= t <= stalled_until]
    expected = (stalled_until - stalled_from) / 0.1
    assert len(during) <= 0.5 * expected, (
        f"{len(during)} WATCHDOG=1 pings in {stalled_until - stalled_from:.2f} s of stalled "
        f"attempts (a healthy daemon pings every 0.1 s)")
    small = json.dumps({"schema_version": 1,
                        "aliases": {"a": {"upstream": "https://a.example/v1"}}}).encode()
    good = await trio.to_thread.run_sync(publish, db, small)
    await daemon.wait_log("published", revision=good)
    healed_from = time.monotonic()
    await poll_until(lambda: any(t > healed_from + 0.5 and code == 200
                                 for t, code, _ in seen))
    await poll_until(lambda: sum(1 for t in pings if t > healed_from) >= 5)
