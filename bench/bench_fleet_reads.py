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

    python bench/bench_fleet_reads.py [--dsn DSN] [--reads 5000] [--pgbouncer-port N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from typing import Any

import psycopg
import trio

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.factory import open_store
from supervisor.revision.document import SCHEMA_VERSION

DEFAULT_DSN = os.environ.get("SUPERVISOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BODY = b'{"schema_version": 1, "aliases": {"a": {"upstream": "https://a.example/"}}}'
TICKS = os.sysconf("SC_CLK_TCK")


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
    store = open_store(ControlPlaneConfig(url=url), max_schema_version=SCHEMA_VERSION)
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--reads", type=int, default=5000)
    parser.add_argument("--pgbouncer-port", type=int)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    dbname = f"bench_fleet_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
        try:
            url = dsn_for(args.dsn, dbname)
            store = open_store(ControlPlaneConfig(url=url), max_schema_version=SCHEMA_VERSION)
            await store.migrate()
            await store.publish(BODY, 1, "bench")
            await store.aclose()
            result: dict[str, Any] = {
                "floor_select_1": floor(url, args.reads),
                "observe_direct": await observe_reads(url, args.reads, admin, dbname),
            }
            if args.pgbouncer_port:
                result["observe_pgbouncer"] = await observe_reads(
                    dsn_for(args.dsn, dbname, args.pgbouncer_port), args.reads, None, dbname)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
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
