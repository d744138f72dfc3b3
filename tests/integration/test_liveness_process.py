"""Liveness that means something, through the real daemon process.

The stall rule: ``/healthz`` answers 503 naming the stall, and ``WATCHDOG=1``
stops, while the convergence loop has not finished an attempt for longer than
``stall_limit_s``: the waits between attempts plus the store's own deadlines of
one (its reads at ``read_timeout_s``, the hydrate's grown with the largest body
allowed), which a slow store never exceeds. A compile has no deadline of its
own: here the limit is about 1.6 s (the store's deadlines at their smallest) and
a ~57 MB revision of 1.6 million small aliases whose one key names a secret that
is never set takes over 2.5 s to compile (an idle machine) before it is refused, and it is retried at every poll. Once
a good revision is published, attempts are quick again: 200, and the pings resume.

The start rule: a restarted child that has not reported started for longer than
the same limit is down. The test-only fault ``hang-<child>`` crashes the LISTEN
child and makes its restart hang before reporting started; /healthz names it,
the pings stop (the convergence loop keeps finishing attempts, so no stall is
involved), and an injected crash that ends the hang brings both back.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import signal
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from supervisor.config import ControlPlaneConfig
from supervisor.health import stall_limit_s
from tests.health import metric
from tests.memorydrills import costly_body, failures
from tests.polling import POLL_INTERVAL_S, poll_until
from tests.postgres import listener_pids
from tests.proc import EXAMPLE, NotifySocket, acli, free_port, run_daemon, write_config

STALL = "convergence has not finished an attempt for"
STUCK = "child listen has been starting for"
#: The store's deadlines at their smallest: the stall limit is mostly the poll and backoff.
QUICK_STORE = {"read_timeout_s": 0.5, "min_read_rate_kib_s": 1 << 20,
               "max_revision_bytes": 64 * 1024 * 1024}


def quick_store_lines() -> str:
    return "\n".join(f"{key} = {value}" for key, value in QUICK_STORE.items())


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


@asynccontextmanager
async def observed(config: Path, port: int, tmp_path: Path, env: dict[str, str],
                   ) -> AsyncIterator[tuple[Any, list[tuple[float, int, Any]], list[float]]]:
    """The daemon, ready, with its WATCHDOG=1 pings and /healthz answers recorded as they come.

    ``env`` is added to ``NOTIFY_SOCKET`` and a 0.2 s ``WATCHDOG_USEC`` (a ping
    each 0.1 s while healthy). /healthz is sampled from a thread, so this test's
    own event loop never slows the sampling down.
    """
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "200000", **env}
    seen: list[tuple[float, int, Any]] = []
    pings: list[float] = []
    stop = threading.Event()
    try:
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
                yield daemon, seen, pings
            finally:
                stop.set()
                nursery.cancel_scope.cancel()
    finally:
        notify.close()


async def test_a_stalled_convergence_loop_is_unhealthy_and_stops_the_watchdog(
        tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "cp.db"
    config = write_config(tmp_path, f"sqlite:///{db}", port=port, poll_interval_s=0.01,
                          backoff_initial_s=0.01, backoff_max_s=0.01,
                          control_plane_extra=quick_store_lines())
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    big = costly_body(60 * 1024 * 1024)
    with trio.fail_after(120):
        async with observed(config, port, tmp_path, {}) as (daemon, seen, pings):
            await scenario(daemon, port, db, big, seen, pings)


async def scenario(daemon: Any, port: int, db: Path, big: bytes,
                   seen: list[tuple[float, int, Any]], pings: list[float]) -> None:
    """Healthy, stalled by the big refusal (503, no pings), healed by a good publish."""
    await poll_until(lambda: any(code == 200 for _, code, _ in seen))
    await trio.to_thread.run_sync(publish, db, big)
    await daemon.wait_log("revision refused; previous snapshot keeps serving",
                          reason="secret")
    # Three more refusals, each a long attempt (the secret is retried every poll).
    stalled_from = time.monotonic()
    first = await failures(port)

    async def three_more() -> bool:
        return await failures(port) >= first + 3

    await poll_until(three_more)
    stalled_until = time.monotonic()
    unhealthy = [b for t, code, b in seen if code == 503 and t >= stalled_from]
    assert unhealthy, "/healthz never answered 503 while the loop stalled"
    limit = stall_limit_s(ControlPlaneConfig(poll_interval_s=0.01, backoff_initial_s=0.01,
                                             backoff_max_s=0.01, **QUICK_STORE))
    assert all(any(reason.startswith(STALL) and reason.endswith(f"(limit {limit:g} s)")
                   for reason in b["unhealthy"]) for b in unhealthy), unhealthy
    # Each attempt past the limit stops the pings until it finishes (a healthy daemon
    # pings every 0.1 s): a gap of several intervals, once for each stalled attempt.
    during = [t for t in pings if stalled_from <= t <= stalled_until]
    gaps = [b - a for a, b in itertools.pairwise([stalled_from, *during, stalled_until])]
    assert max(gaps) >= 0.3, (
        f"{len(during)} WATCHDOG=1 pings in {stalled_until - stalled_from:.2f} s of stalled "
        f"attempts, never 0.3 s apart (a healthy daemon pings every 0.1 s)")
    small = json.dumps({"schema_version": 1,
                        "aliases": {"a": {"upstream": "https://a.example/v1"}}}).encode()
    good = await trio.to_thread.run_sync(publish, db, small)
    await daemon.wait_log("published", revision=good)
    healed_from = time.monotonic()
    await poll_until(lambda: any(t > healed_from + 0.5 and code == 200
                                 for t, code, _ in seen))
    await poll_until(lambda: sum(1 for t in pings if t > healed_from) >= 5)


async def test_a_restart_stuck_starting_is_unhealthy_and_stops_the_watchdog(
        tmp_path: Path, pg_url: str) -> None:
    port = free_port()
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    # The limit (stall_limit_s): 3 * 0.3 + 0.3 s plus the store's smallest deadlines;
    # a PostgreSQL attempt takes milliseconds.
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=0.3, listen=True,
                          backoff_max_s=0.3, control_plane_extra=quick_store_lines())
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with observed(config, port, tmp_path, {"SUPERVISOR_TEST_FAULT_DIR": str(fault_dir)}
                            ) as (daemon, seen, pings):
            await stuck_scenario(daemon, port, pg_url, fault_dir, seen, pings)


async def stuck_scenario(daemon: Any, port: int, pg_url: str, fault_dir: Path,
                         seen: list[tuple[float, int, Any]], pings: list[float]) -> None:
    """Healthy; listen's restart hangs (503 naming it, no pings); a crash ends the hang."""
    await poll_until(lambda: any(code == 200 for _, code, _ in seen) and len(pings) >= 3)
    (fault_dir / "hang-listen").touch()
    daemon.signal(signal.SIGUSR2)
    await daemon.wait_log("fault injection", child="listen", fault="hang", injected=True)
    await daemon.wait_log("restarting child", child="listen", restarts=1)
    await poll_until(lambda: any(code == 503 and any(r.startswith(STUCK) for r in b["unhealthy"])
                                 for _, code, b in seen))
    stuck_from = time.monotonic()
    # The window: four more convergence attempts (about 1.2 s at a 0.3 s poll). The loop
    # keeps finishing attempts, so only the start rule can stop the pings in it.
    first = await convergence_attempts(port)

    async def four_more() -> bool:
        return await convergence_attempts(port) >= first + 4

    await poll_until(four_more)
    window = (stuck_from + 0.2, time.monotonic())  # a ping sent just before may land late
    assert window[1] - window[0] >= 0.8
    during = [t for t in pings if window[0] <= t <= window[1]]
    assert during == [], (f"{len(during)} WATCHDOG=1 pings in {window[1] - window[0]:.2f} s "
                          "with listen stuck starting (a healthy daemon pings every 0.1 s)")
    reasons = next(b["unhealthy"] for t, code, b in reversed(seen) if code == 503)
    limit = stall_limit_s(ControlPlaneConfig(poll_interval_s=0.3, backoff_max_s=0.3,
                                             **QUICK_STORE))
    assert any(r.startswith(STUCK) and r.endswith(f"(limit {limit:g} s)") for r in reasons), (
        reasons)
    async with httpx.AsyncClient(timeout=5.0) as client:
        report = (await client.get(f"http://127.0.0.1:{port}/status")).json()
    assert report["children"]["listen"] == {
        "state": "starting", "restarts": 1,
        "last_error": "InjectedFault: fault injected into child 'listen' by a test"}
    assert listener_pids(pg_url) == []  # the hung restart never connected
    # A crash ends the hang; the next start is a real one: healthy, pinging, listening.
    (fault_dir / "crash-listen").touch()
    daemon.signal(signal.SIGUSR2)
    await daemon.wait_log("restarting child", child="listen", restarts=2)
    healed_from = time.monotonic()
    await poll_until(lambda: listener_pids(pg_url) != [])
    await poll_until(lambda: any(t > healed_from + 0.5 and code == 200
                                 for t, code, _ in seen))
    await poll_until(lambda: sum(1 for t in pings if t > healed_from) >= 5)


async def convergence_attempts(port: int) -> float:
    """All convergence attempts so far, by outcome (supervisor_convergence_attempts_total)."""
    return await metric(port, "supervisor_convergence_attempts_total")
