"""Commit to published: from the publishing transaction's COMMIT to the daemon's
``published`` event on the WebSocket stream ``/v1/stream``.

Scenarios, each its own daemon process on a fresh PostgreSQL database:

* polling only (``listen = false``, ``poll_interval_s = 0.05``) with revisions of
  10, 1,000 and 10,000 aliases;
* LISTEN on (``poll_interval_s = 3600``, so only a notification can wake it)
  with 1,000 aliases.

Each iteration publishes a new revision with plain SQL (insert, point
``supervisor_desired`` at it; the clock starts just before ``COMMIT``) from a
worker thread while a trio-websocket client follows the stream; the next
iteration starts after a random pause of up to one poll interval, so polling
latency is sampled over the whole poll phase; with LISTEN the pause starts at the
default ``notify_min_interval_s`` (0.05 s), as publishes an operator makes are
further apart than that: a notification sooner after the last wake-up is held
for the rest of the interval (a storm), which is measured by no scenario here.
Printed next to floors measured in the same run:

* ``notify``: the bare NOTIFY round trip (a plain psycopg listener thread woken by
  a sender's committed ``pg_notify``);
* ``fetch``: one plain psycopg ``SELECT body`` of the same revision (hydration's floor);
* ``decode``: a bare ``msgspec.json.decode`` of the same body;
* ``compile``: :func:`supervisor.revision.compile.compile_revision` of that body
  in this process (what the daemon must do at least once per revision).

Aim for LISTEN: p50 within 2 x notify p50 + compile p50.

    /work/venv/bin/python bench/bench_convergence.py [--dsn DSN] [--scale 1.0] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import trio
from trio_websocket import open_websocket_url

from supervisor.config import ControlPlaneConfig
from supervisor.revision.compile import compile_revision
from supervisor.revision.secrets import EnvFileResolver

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.pgserver

from tests import pgserver

REPO = Path(__file__).resolve().parents[1]
# The daemon's default wake-up floor: LISTEN iterations pause at least this long.
NOTIFY_FLOOR_S = next(f.default for f in msgspec.structs.fields(ControlPlaneConfig)
                      if f.name == "notify_min_interval_s")


@dataclass(frozen=True)
class Scenario:
    name: str
    aliases: int
    listen: bool
    iterations: int

    @property
    def poll_interval_s(self) -> float:
        return 3600.0 if self.listen else 0.05


SCENARIOS = (
    Scenario("poll 0.05 s", 10, False, 300),
    Scenario("poll 0.05 s", 1_000, False, 200),
    Scenario("poll 0.05 s", 10_000, False, 100),
    Scenario("LISTEN", 1_000, True, 300),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return {"n": len(ms), "p50_ms": cuts[49], "p99_ms": cuts[98],
            "mean_ms": statistics.fmean(ms), "max_ms": ms[-1]}


def body_of(aliases: int, tag: str) -> bytes:
    doc = {
        "schema_version": 1,
        "aliases": {f"a{i:05d}": {"upstream": f"https://svc-{i}.{tag}.example/v1",
                                  "timeout_s": 30, "retries": 2} for i in range(aliases)},
        "keys": {"bench": {"secret": "env:BENCH_KEY", "aliases": ["a00000"]}},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def insert_revision(conn: psycopg.Connection[Any], body: bytes) -> int:
    row = conn.execute(
        "INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)"
        " VALUES (1, %s, %s, 'bench') RETURNING id", (body, hashlib.sha256(body).digest()),
    ).fetchone()
    assert row is not None
    return int(row[0])


def point_desired(conn: psycopg.Connection[Any], rid: int) -> None:
    conn.execute(
        "INSERT INTO supervisor_desired (singleton, revision_id, updated_at)"
        " VALUES (true, %s, now()) ON CONFLICT (singleton) DO UPDATE"
        " SET revision_id = excluded.revision_id, updated_at = now()", (rid,))


# -- floors -------------------------------------------------------------------------


def floor_notify(url: str, iterations: int, body: bytes | None = None) -> list[float]:
    """A plain psycopg listener thread, woken by a sender's commit.

    ``body`` None: the sender's transaction is a bare ``pg_notify``. Else it is the
    publishing transaction itself (insert ``body``, point desired at it; the
    schema's trigger sends the NOTIFY), whose commit also flushes the WAL.
    """
    channel = "bench_floor" if body is None else "supervisor_desired"
    receiver = psycopg.connect(url, autocommit=True)
    receiver.execute(f"LISTEN {channel}")
    sender = psycopg.connect(url)
    woke: queue.Queue[float] = queue.Queue()
    stop = threading.Event()

    def receive() -> None:
        for _ in receiver.notifies():
            woke.put(time.perf_counter())
            if stop.is_set():
                return

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    samples = []
    try:
        for i in range(iterations + 10):
            if body is None:
                sender.execute("SELECT pg_notify('bench_floor', %s)", (str(i),))
            else:
                point_desired(sender, insert_revision(sender, body))
            start = time.perf_counter()
            sender.commit()
            at = woke.get(timeout=10)
            if i >= 10:
                samples.append(at - start)
        stop.set()
        sender.execute(f"SELECT pg_notify('{channel}', 'stop')")
        sender.commit()
        thread.join(timeout=10)
    finally:
        sender.close()
        receiver.close()
    return samples


def floor_fetch(url: str, rid: int, iterations: int) -> list[float]:
    samples = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(iterations):
            start = time.perf_counter()
            with conn.cursor(binary=True) as cur:
                cur.execute("SELECT body FROM supervisor_revisions WHERE id = %s", (rid,))
                cur.fetchone()
            samples.append(time.perf_counter() - start)
    return samples


def floor_cpu(body: bytes, iterations: int) -> tuple[list[float], list[float]]:
    decode, compiled = [], []
    resolver = EnvFileResolver({"BENCH_KEY": "bench-secret"})
    for i in range(iterations):
        start = time.perf_counter()
        msgspec.json.decode(body)
        decode.append(time.perf_counter() - start)
        start = time.perf_counter()
        compile_revision(body, revision=i + 1, generation=i + 1, resolver=resolver)
        compiled.append(time.perf_counter() - start)
    return decode, compiled


# -- the daemon ---------------------------------------------------------------------


def run_scenario(admin_dsn: str, scenario: Scenario, iterations: int) -> dict[str, Any]:
    dbname = f"bench_conv_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    base, _, _ = admin_dsn.rpartition("/")
    url = f"{base}/{dbname}"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-conv-") as tmp:
            workdir = Path(tmp)
            port = free_port()
            config = workdir / "supervisor.toml"
            config.write_text(
                f'[log]\nlevel = "warning"\nformat = "json"\n'
                f'[control_plane]\nurl = "{url}"\npoll_interval_s = {scenario.poll_interval_s}\n'
                f'listen = {"true" if scenario.listen else "false"}\n'
                f'[admin]\nlisten = "127.0.0.1:{port}"\n')
            subprocess.run([sys.executable, "-m", "supervisor", "db", "migrate", "--config",
                            str(config)], check=True, cwd=REPO, capture_output=True)
            with psycopg.connect(url) as conn:
                first = insert_revision(conn, body_of(scenario.aliases, "t0"))
                point_desired(conn, first)
                conn.commit()
                fetch = floor_fetch(url, first, 50)
            attempts: list[float] = []
            to_event: list[float] = []
            delivery: list[float] = []
            latencies = trio.run(_drive, config, workdir, port, url, scenario, iterations,
                                 attempts, to_event, delivery)
            decode, compiled = floor_cpu(body_of(scenario.aliases, "t0"),
                                         max(5, min(50, iterations // 4)))
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    return {"scenario": scenario.name, "aliases": scenario.aliases,
            "body_bytes": len(body_of(scenario.aliases, "t0")),
            "commit_to_published": summary(latencies), "attempt": summary(attempts),
            "commit_to_event": summary(to_event), "event_to_client": summary(delivery),
            "fetch": summary(fetch),
            "decode": summary(decode), "compile": summary(compiled)}


async def _drive(config: Path, workdir: Path, port: int, url: str, scenario: Scenario,
                 iterations: int, attempts: list[float], to_event: list[float],
                 delivery: list[float]) -> list[float]:
    notify_path = workdir / "notify"
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await sock.bind(str(notify_path))
    log = open(workdir / "daemon.log", "wb")  # noqa: ASYNC230
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "supervisor", "run", "--config", str(config)], cwd=str(REPO),
        env={**os.environ, "NOTIFY_SOCKET": str(notify_path), "BENCH_KEY": "bench-secret"},
        stdout=subprocess.DEVNULL, stderr=log)
    rng = random.Random(1)
    warmup = 5
    bodies = [body_of(scenario.aliases, f"t{k}") for k in range(1, iterations + warmup + 1)]
    samples: list[float] = []
    conn = psycopg.connect(url)
    try:
        with trio.fail_after(60):
            while b"READY=1" not in await sock.recv(65536):
                pass
        async with open_websocket_url(f"ws://127.0.0.1:{port}/v1/stream",
                                      max_message_size=64 * 1024 * 1024) as ws:
            await ws.get_message()  # the current state
            for k, body in enumerate(bodies):
                committed: list[float] = []

                def publish(body: bytes = body, committed: list[float] = committed) -> int:
                    rid = insert_revision(conn, body)
                    point_desired(conn, rid)
                    committed.append(time.perf_counter())
                    committed.append(time.time())
                    conn.commit()
                    return rid

                rid = await trio.to_thread.run_sync(publish)
                with trio.fail_after(30):
                    while True:
                        message = json.loads(await ws.get_message())
                        if message.get("type") == "published" and message["revision"] == rid:
                            seen = time.perf_counter()
                            seen_wall = time.time()
                            took = float(message["took_s"])
                            event_at = datetime.fromisoformat(
                                message["at"].replace("Z", "+00:00")).timestamp()
                            break
                        if message.get("type") == "rejected":
                            raise RuntimeError(f"revision refused: {message}")
                if k >= warmup:
                    samples.append(seen - committed[0])
                    attempts.append(took)
                    # Wall clock (same host): commit -> the daemon's event, event -> client.
                    to_event.append(event_at - committed[1])
                    delivery.append(seen_wall - event_at)
                floor = NOTIFY_FLOOR_S if scenario.listen else 0.0
                await trio.sleep(floor + rng.uniform(0, min(scenario.poll_interval_s, 0.05)))
    finally:
        conn.close()
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with trio.move_on_after(15):
                await process.wait()
            if process.returncode is None:
                process.kill()
        sock.close()
        log.close()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="maintenance database DSN (default: the tests' server, "
                        "tests/pgserver.py: SUPERVISOR_TEST_PG, 127.0.0.1:5432, else its own)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every scenario's iteration count")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.dsn = pgserver.for_script(args.dsn).dsn

    floor_db = f"bench_conv_floor_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{floor_db}"')
    try:
        base, _, _ = args.dsn.rpartition("/")
        floor_url = f"{base}/{floor_db}"
        with tempfile.TemporaryDirectory(prefix="bench-conv-") as tmp:
            config = Path(tmp) / "floor.toml"
            config.write_text(f'[control_plane]\nurl = "{floor_url}"\n')
            subprocess.run([sys.executable, "-m", "supervisor", "db", "migrate", "--config",
                            str(config)], check=True, cwd=REPO, capture_output=True)
        notify = summary(floor_notify(floor_url, 300))
        notify_publish = summary(floor_notify(floor_url, 300, body_of(1_000, "floor")))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{floor_db}" WITH (FORCE)')
    results = [run_scenario(args.dsn, s, max(20, int(s.iterations * args.scale)))
               for s in SCENARIOS]
    for r in results:
        if r["scenario"] == "LISTEN":
            target = 2 * notify_publish["p50_ms"] + r["compile"]["p50_ms"]
            r["aim_p50_ms"] = target
            r["within_aim"] = r["commit_to_published"]["p50_ms"] <= target
    out = {"cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
           "notify_floor": notify, "notify_publish_floor": notify_publish,
           "scenarios": results}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"Commit to published (WebSocket event); {out['cpus']} CPUs, load average"
          f" {out['load_average_1m']:.2f}")
    for label, f in (("bare pg_notify commit", notify),
                     ("publishing transaction (1,000 aliases)", notify_publish)):
        print(f"  floor: NOTIFY round trip, {label}: p50 {f['p50_ms']:.3f} ms"
              f"  p99 {f['p99_ms']:.3f} ms (n={f['n']})")
    print(f"  {'scenario':<12} {'aliases':>7} {'bytes':>9} {'n':>4} {'p50 ms':>8} {'p99 ms':>8}"
          f" {'attempt':>8} {'->event':>8} {'->client':>8} | {'fetch':>7} {'decode':>7}"
          f" {'compile':>8}  (floors, p50 ms)")
    for r in results:
        c = r["commit_to_published"]
        print(f"  {r['scenario']:<12} {r['aliases']:>7} {r['body_bytes']:>9} {c['n']:>4}"
              f" {c['p50_ms']:>8.2f} {c['p99_ms']:>8.2f} {r['attempt']['p50_ms']:>8.2f}"
              f" {r['commit_to_event']['p50_ms']:>8.2f} {r['event_to_client']['p50_ms']:>8.2f} |"
              f" {r['fetch']['p50_ms']:>7.2f} {r['decode']['p50_ms']:>7.2f}"
              f" {r['compile']['p50_ms']:>8.2f}")
        if "aim_p50_ms" in r:
            verdict = "within" if r["within_aim"] else "NOT within"
            print(f"    aim: p50 <= 2 x publishing-transaction notify + compile ="
                  f" {r['aim_p50_ms']:.2f} ms: {verdict}")
    print("  attempt: the daemon's own took_s (observe + hydrate + compile + swap); ->event:"
          " commit to the event's timestamp; ->client: event timestamp to the client; p50")
    return 0


if __name__ == "__main__":
    sys.exit(main())
