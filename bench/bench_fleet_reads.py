"""What one replica's poll costs the PostgreSQL primary: reads/s and server CPU per observe read.

On a fresh database (created here, dropped at the end) with one published
revision, :meth:`PostgresStore.observe` (the read every replica makes every
``poll_interval_s``) runs ``--reads`` times back to back through the real store
(its per-transaction ``statement_timeout``: BEGIN + SET LOCAL, the read,
COMMIT). Reported:

- reads/s from one client, and the wall time per read;
- the server's CPU time per read: the serving backend's utime + stime from
  ``/proc/<pid>/stat`` before and after (the bench runs on the database's
  machine, as root or as postgres);
- the floor beside it: a bare ``SELECT 1`` on a plain psycopg connection, same count;
- with ``--pgbouncer-port``: the same observe reads through PgBouncer (wall time
  only: its server backend is shared and not ours to attribute).

- with ``--replicas N``: a simulated fleet, N stores (one connection each, as N
  replicas hold) in this process, each polling ``observe`` every ``--poll``
  seconds (spread evenly over the interval) for ``--duration`` seconds; the
  load on the primary: its connections to the database, reads/s, the CPU share
  of one core of every backend serving the database, read p50/p99; then the
  same fleet through a PgBouncer in transaction pooling mode started here
  (Debian's package, one server connection per pool: ``tests/pgfleet.py``),
  with PgBouncer's own CPU share beside it. ``--pgbouncer-port`` is not needed.
  Directly, one session per replica: PostgreSQL's default ``max_connections``
  (100) refuses a fleet of 200 ("too many clients already"), so the direct run
  is capped at ``--direct-max`` replicas (40) and its load scaled to N.

    python bench/bench_fleet_reads.py [--dsn DSN] [--reads 5000] [--pgbouncer-port N] [--json]
    python bench/bench_fleet_reads.py --replicas 200 [--poll 5] [--duration 30]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import trio

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.factory import open_admin
from supervisor.revision.document import SCHEMA_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.pgserver

from tests import pgserver

BODY = b'{"schema_version": 1, "aliases": {"a": {"upstream": "https://a.example/"}}}'
TICKS = os.sysconf("SC_CLK_TCK")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dsn_for(dsn: str, dbname: str, port: int | None = None) -> str:
    base = dsn.rpartition("/")[0]
    if port is not None:
        base = base.rpartition(":")[0] + f":{port}"
    return f"{base}/{dbname}"


def backend_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def our_backends(admin: psycopg.Connection[Any], dbname: str) -> list[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
        [dbname, "trio-supervisor"]).fetchall()
    return [int(r[0]) for r in rows]


async def observe_reads(url: str, reads: int, admin: psycopg.Connection[Any] | None,
                        dbname: str) -> dict[str, float]:
    store = open_admin(ControlPlaneConfig(url=url), max_schema_version=SCHEMA_VERSION)
    try:
        await store.observe()  # connect outside the measurement
        pids = our_backends(admin, dbname) if admin is not None else []
        cpu0 = sum(backend_cpu_s(p) for p in pids)
        start = time.perf_counter()
        for _ in range(reads):
            await store.observe()
        wall = time.perf_counter() - start
        cpu = sum(backend_cpu_s(p) for p in pids) - cpu0
    finally:
        await store.aclose()
    out = {"reads_per_s": reads / wall, "wall_ms_per_read": wall / reads * 1000}
    if pids:
        out["server_cpu_us_per_read"] = cpu / reads * 1e6
    return out


def floor(url: str, reads: int) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        cpu0 = backend_cpu_s(pid)
        start = time.perf_counter()
        for _ in range(reads):
            conn.execute("SELECT 1").fetchone()
        wall = time.perf_counter() - start
        cpu = backend_cpu_s(pid) - cpu0
    return {"reads_per_s": reads / wall, "wall_ms_per_read": wall / reads * 1000,
            "server_cpu_us_per_read": cpu / reads * 1e6}


def db_backends(admin: psycopg.Connection[Any], dbname: str) -> list[int]:
    rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                         [dbname]).fetchall()
    return [int(r[0]) for r in rows]


def _cpu(pid: int) -> float:
    """CPU seconds of ``pid`` in nanosecond resolution (``/proc/PID/schedstat``: a fleet's
    backends each run a few reads, far below the 10 ms ticks of ``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        return 0.0  # gone meanwhile


async def fleet(url: str, replicas: int, poll_s: float, duration_s: float,
                admin: psycopg.Connection[Any], dbname: str,
                bouncer_pid: int | None = None) -> dict[str, float]:
    """N replicas' polls on one database; see the module docstring."""
    stores = [open_admin(ControlPlaneConfig(url=url), max_schema_version=SCHEMA_VERSION)
              for _ in range(replicas)]
    latencies: list[float] = []
    try:
        async with trio.open_nursery() as nursery:  # connect all, outside the measurement
            for store in stores:
                nursery.start_soon(store.observe)
        before = {pid: _cpu(pid) for pid in db_backends(admin, dbname)}
        bouncer0 = _cpu(bouncer_pid) if bouncer_pid else 0.0
        start = trio.current_time()

        async def replica(store: Any, offset: float) -> None:
            await trio.sleep(offset)
            while True:
                t0 = trio.current_time()
                await store.observe()
                latencies.append(trio.current_time() - t0)
                await trio.sleep_until(t0 + poll_s)

        with trio.move_on_after(duration_s):
            async with trio.open_nursery() as nursery:
                for i, store in enumerate(stores):
                    nursery.start_soon(replica, store, poll_s * i / replicas)
        elapsed = trio.current_time() - start
        pids = db_backends(admin, dbname)
        cpu = sum(_cpu(pid) - before.get(pid, 0.0) for pid in pids)
        bouncer = (_cpu(bouncer_pid) - bouncer0) if bouncer_pid else 0.0
    finally:
        for store in stores:
            await store.aclose()
    latencies.sort()
    out = {
        "replicas": float(replicas),
        "poll_s": poll_s,
        "connections_on_primary": float(len(pids)),
        "reads_per_s": len(latencies) / elapsed,
        "primary_cpu_share_of_one_core": cpu / elapsed,
        "read_p50_ms": 1000 * latencies[len(latencies) // 2],
        "read_p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }
    if bouncer_pid:
        out["pgbouncer_cpu_share_of_one_core"] = bouncer / elapsed
    return out


async def fleet_with_and_without_pgbouncer(args: argparse.Namespace, url: str,
                                           admin: psycopg.Connection[Any],
                                           dbname: str) -> dict[str, Any]:
    from tests.pgfleet import pgbouncer  # the same PgBouncer the tests start

    # PostgreSQL's default max_connections (100) cannot hold a session per replica
    # for a fleet of 200, and this server is shared: the direct run is capped at
    # --direct-max replicas and its load scaled to the fleet, stated as such.
    direct = min(args.replicas, args.direct_max)
    measured = await fleet(url, direct, args.poll, args.duration, admin, dbname)
    scale = args.replicas / direct
    result = {"fleet_direct_measured": measured,
              "fleet_direct_scaled": {
                  "replicas": float(args.replicas),
                  "connections_on_primary": measured["connections_on_primary"] * scale,
                  "reads_per_s": measured["reads_per_s"] * scale,
                  "primary_cpu_share_of_one_core":
                      measured["primary_cpu_share_of_one_core"] * scale}}
    with pgbouncer(pgserver.for_script(args.dsn)) as port:
        pid = _pgbouncer_pid(port)
        result["fleet_pgbouncer"] = await fleet(dsn_for(args.dsn, dbname, port), args.replicas,
                                                args.poll, args.duration, admin, dbname, pid)
    return result


def _pgbouncer_pid(port: int) -> int | None:
    import subprocess

    found = subprocess.run(["pgrep", "-n", "-x", "pgbouncer"], capture_output=True, text=True)
    return int(found.stdout.split()[0]) if found.stdout.strip() else None


async def main() -> None:
    from supervisor.logs import configure

    configure("warning", "console")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="maintenance database DSN (default: the tests' server, "
                        "tests/pgserver.py: SUPERVISOR_TEST_PG, 127.0.0.1:5432, else its own)")
    parser.add_argument("--reads", type=int, default=5000)
    parser.add_argument("--pgbouncer-port", type=int)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--replicas", type=int, help="simulate a fleet of N replicas")
    parser.add_argument("--poll", type=float, default=5.0, help="the fleet's poll_interval_s")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of fleet load")
    parser.add_argument("--direct-max", type=int, default=40,
                        help="direct sessions at most (the server's max_connections is shared)")
    args = parser.parse_args()
    args.dsn = pgserver.for_script(args.dsn).dsn
    dbname = f"bench_fleet_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
        try:
            url = dsn_for(args.dsn, dbname)
            store = open_admin(ControlPlaneConfig(url=url), max_schema_version=SCHEMA_VERSION)
            await store.migrate()
            await store.publish(BODY, 1, "bench")
            await store.aclose()
            if args.replicas:
                fleet_result = await fleet_with_and_without_pgbouncer(args, url, admin, dbname)
            result: dict[str, Any] = {
                "floor_select_1": floor(url, args.reads),
                "observe_direct": await observe_reads(url, args.reads, admin, dbname),
            }
            if args.pgbouncer_port:
                result["observe_pgbouncer"] = await observe_reads(
                    dsn_for(args.dsn, dbname, args.pgbouncer_port), args.reads, None, dbname)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    if args.replicas:
        result.update(fleet_result)
    per_read_us = result["observe_direct"]["server_cpu_us_per_read"]
    # The fleet arithmetic: N replicas each polling every P seconds.
    result["fleet_1000_at_5s"] = {
        "reads_per_s": 1000 / 5,
        "server_cpu_share_of_one_core": 1000 / 5 * per_read_us / 1e6,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, figures in result.items():
        print(name, " ".join(f"{k}={v:.3f}" for k, v in figures.items()))


if __name__ == "__main__":
    trio.run(main)
