"""How much latency the LISTEN child adds on top of PostgreSQL's own NOTIFY round trip.

Two measurements on a fresh database (created here, dropped at the end):

1. The floor: a plain psycopg listener (a thread blocked in
   ``Connection.notifies()``) and a sender that runs ``SELECT pg_notify(...)``
   in autocommit (so the statement commits). Latency = from just before the
   sender's statement to the listener thread waking with the notification.
2. The same sender, but received by :func:`supervisor.controlplane.listen.run_listener`
   under trio: latency = from just before the sender's statement to
   ``ChangeSignal.wait()`` returning in a trio task.

One notification in flight at a time (the next is sent once the previous one
arrived), so nothing coalesces. The receiver runs with ``notify_min_interval_s =
0``: back-to-back round trips are a storm to the default floor (0.05 s), which
would hold each one for the rest of the interval; the floor is a policy, not
the path measured here (bench_convergence measures publishes spaced beyond it).
Reports p50/p99/mean/max of each and the listener-to-floor ratios.

    /work/venv/bin/python bench/bench_notify.py [--dsn DSN] [--iterations 300] [--json]

``--dsn`` names the maintenance database to create the scratch database from
(default: the tests' server, tests/pgserver.py: ``$SUPERVISOR_TEST_PG``, the server on
127.0.0.1:5432, else one of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import trio

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.listen import run_listener
from supervisor.convergence.signal import ChangeSignal
from supervisor.dsn import redact
from supervisor.logs import configure
from supervisor.telemetry import Metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.pgserver

from tests import pgserver

CHANNEL = "bench_notify"


def dsn_for(admin_dsn: str, dbname: str) -> str:
    base, _, _ = admin_dsn.rpartition("/")
    return f"{base}/{dbname}"


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return {
        "n": len(ms),
        "p50_ms": cuts[49],
        "p99_ms": cuts[98],
        "mean_ms": statistics.fmean(ms),
        "max_ms": ms[-1],
    }


def bench_floor(url: str, iterations: int, warmup: int) -> list[float]:
    """Plain psycopg on both ends; the receiver is a thread blocked in notifies()."""
    receiver = psycopg.connect(url, autocommit=True)
    receiver.execute(f"LISTEN {CHANNEL}")
    sender = psycopg.connect(url, autocommit=True)
    woke: queue.Queue[tuple[str, float]] = queue.Queue()

    def receive() -> None:
        for note in receiver.notifies():
            woke.put((note.payload, time.perf_counter()))
            if note.payload == "stop":
                return

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    samples: list[float] = []
    try:
        for i in range(warmup + iterations):
            start = time.perf_counter()
            sender.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(i)])
            payload, at = woke.get(timeout=10)
            assert payload == str(i), (payload, i)
            if i >= warmup:
                samples.append(at - start)
        sender.execute("SELECT pg_notify(%s, 'stop')", [CHANNEL])
        thread.join(timeout=10)
    finally:
        sender.close()
        receiver.close()
    return samples


def bench_listener(url: str, iterations: int, warmup: int) -> list[float]:
    """The same sender; the receiver is run_listener poking a ChangeSignal under trio."""

    async def main() -> list[float]:
        signal, metrics = ChangeSignal(), Metrics(process=False)
        config = ControlPlaneConfig(url=url, channel=CHANNEL, notify_min_interval_s=0.0)
        sender = await trio.to_thread.run_sync(lambda: psycopg.connect(url, autocommit=True))
        samples: list[float] = []
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(run_listener, config, signal.notify, metrics)
                with trio.fail_after(10):
                    if await signal.wait() != "reconnect":
                        raise RuntimeError("expected the connect wake-up first")
                for i in range(warmup + iterations):
                    stamp: list[float] = []

                    def send(i: int = i, stamp: list[float] = stamp) -> None:
                        stamp.append(time.perf_counter())
                        sender.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(i)])

                    async def send_in_thread(send: Any = send) -> None:
                        await trio.to_thread.run_sync(send)

                    # The sender runs in a worker thread, so the trio thread is
                    # free to see the socket become readable while it commits.
                    async with trio.open_nursery() as inner:
                        inner.start_soon(send_in_thread)
                        with trio.fail_after(10):
                            trigger = await signal.wait()
                        woke = time.perf_counter()
                    if trigger != "notify":
                        raise RuntimeError(f"listener reconnected mid-run ({trigger})")
                    if i >= warmup:
                        samples.append(woke - stamp[0])
                nursery.cancel_scope.cancel()
        finally:
            sender.close()
        return samples

    return trio.run(main)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="maintenance database DSN (default: the tests' server, "
                        "tests/pgserver.py: SUPERVISOR_TEST_PG, 127.0.0.1:5432, else its own)")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.dsn = pgserver.for_script(args.dsn).dsn
    if args.iterations < 200:
        parser.error("--iterations must be at least 200 for a meaningful p99")

    configure(level="warning", fmt="console", stream=sys.stderr)
    dbname = f"bench_notify_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        url = dsn_for(args.dsn, dbname)
        floor = summary(bench_floor(url, args.iterations, args.warmup))
        listener = summary(bench_listener(url, args.iterations, args.warmup))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')

    result: dict[str, Any] = {
        "server": redact(args.dsn),
        # Tails (p99, max) mostly measure the machine: report how busy it was.
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "iterations": args.iterations,
        "floor": floor,
        "run_listener": listener,
        "ratio_p50": listener["p50_ms"] / floor["p50_ms"],
        "ratio_p99": listener["p99_ms"] / floor["p99_ms"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"NOTIFY round trip, {args.iterations} iterations ({args.warmup} warm-up discarded);"
        f" {result['cpus']} CPUs, load average {result['load_average_1m']:.2f}"
    )
    for name in ("floor", "run_listener"):
        s = result[name]
        print(
            f"  {name:<13} p50 {s['p50_ms']:7.3f} ms  p99 {s['p99_ms']:7.3f} ms"
            f"  mean {s['mean_ms']:7.3f} ms  max {s['max_ms']:7.3f} ms"
        )
    print(f"  ratio to floor: p50 x{result['ratio_p50']:.2f}  p99 x{result['ratio_p99']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
