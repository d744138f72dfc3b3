"""What an idle, converged daemon costs: CPU share of one core and resident memory.

Two configurations, each its own daemon process, converged and then left alone:

1. ``sqlite``: the embedded default (SQLite control plane, default poll interval
   5 s, Kubernetes off, snapshot file on);
2. ``postgresql``: PostgreSQL with LISTEN (default poll interval 5 s).

For each, after READY=1 and a settle period, CPU time (``utime + stime`` from
``/proc/PID/stat``, every thread of the process) and RSS (``VmRSS`` from
``/proc/PID/status``, sampled every second) are read over ``--seconds``. Printed
next to a floor measured in the same run: an idle interpreter that imported the
same libraries and sleeps.

    /work/venv/bin/python bench/bench_idle.py [--seconds 60] [--dsn DSN] [--json]

Aims: under 1 % of one core and under 80 MB RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.pgserver

from tests import pgserver

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "conf" / "example-revision.toml"
TICKS = os.sysconf("SC_CLK_TCK")
AIM_CPU_PCT, AIM_RSS_MB = 1.0, 80.0
FLOOR_IMPORTS = ("import time, trio, h11, wsproto, psycopg, msgspec, structlog, httpx,"
                 " nacl.signing, prometheus_client, trio_websocket; time.sleep(10**6)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def measure(pid: int, seconds: float) -> dict[str, float]:
    rss: list[float] = []
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    deadline = t0 + seconds
    while time.monotonic() < deadline:
        rss.append(rss_mb(pid))
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    rss.append(rss_mb(pid))
    return {"cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0), "cpu_s": cpu1 - cpu0,
            "wall_s": t1 - t0, "rss_mb": statistics.fmean(rss), "rss_max_mb": max(rss)}


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "supervisor", *args], check=True, cwd=REPO,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@contextlib.contextmanager
def daemon(config: Path, workdir: Path) -> Iterator[int]:
    """Start the daemon, wait for READY=1, yield its pid; SIGTERM it after."""
    notify_path = workdir / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.settimeout(60)
    with open(workdir / "daemon.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "run", "--config", str(config)],
            # The example revision's key is "file:conf/example.key", relative to the repository.
            cwd=REPO, env={**os.environ, "NOTIFY_SOCKET": str(notify_path)},
            stdout=subprocess.DEVNULL, stderr=log,
        )
    try:
        try:
            while b"READY=1" not in sock.recv(65536):
                pass
        except TimeoutError:
            raise SystemExit("no READY=1 within 60 s:\n"
                             + (workdir / "daemon.log").read_text()) from None
        yield proc.pid
    finally:
        sock.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def write_config(workdir: Path, url: str, extra: str = "") -> Path:
    config = workdir / "supervisor.toml"
    # poll_interval_s is left at its default (5 s): the idle cost of the defaults.
    config.write_text(
        f'[log]\nlevel = "info"\nformat = "json"\n'
        f'[control_plane]\nurl = "{url}"\n{extra}'
        f'[snapshot]\npath = "{workdir}/snapshot.json"\n'
        f'[admin]\nlisten = "127.0.0.1:{free_port()}"\n'
    )
    return config


def run_sqlite(seconds: float, settle: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        workdir = Path(tmp)
        config = write_config(workdir, f"sqlite:///{workdir}/controlplane.db")
        cli("publish", "--config", str(config), str(EXAMPLE), "--force")
        with daemon(config, workdir) as pid:
            time.sleep(settle)
            return measure(pid, seconds)


def run_postgresql(dsn: str, seconds: float, settle: float) -> dict[str, float]:
    dbname = f"bench_idle_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        base, _, _ = dsn.rpartition("/")
        with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
            workdir = Path(tmp)
            config = write_config(workdir, f"{base}/{dbname}", "listen = true\n")
            cli("db", "migrate", "--config", str(config))
            cli("publish", "--config", str(config), str(EXAMPLE), "--force")
            with daemon(config, workdir) as pid:
                time.sleep(settle)
                return measure(pid, seconds)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def run_floor(seconds: float, settle: float) -> dict[str, float]:
    proc = subprocess.Popen([sys.executable, "-c", FLOOR_IMPORTS], cwd=REPO)
    try:
        time.sleep(settle + 1.0)  # imports done
        return measure(proc.pid, seconds)
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="sampling window per run")
    parser.add_argument("--settle", type=float, default=3.0, help="wait after READY=1")
    parser.add_argument("--dsn", help="maintenance database DSN (default: the tests' server, "
                        "tests/pgserver.py: SUPERVISOR_TEST_PG, 127.0.0.1:5432, else its own)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.dsn = pgserver.for_script(args.dsn).dsn

    results: dict[str, Any] = {
        "seconds": args.seconds,
        "cpus": os.cpu_count(),
        "floor": run_floor(args.seconds, args.settle),
        "sqlite": run_sqlite(args.seconds, args.settle),
        "postgresql": run_postgresql(args.dsn, args.seconds, args.settle),
        "load_average_1m": os.getloadavg()[0],
    }
    ok = all(results[name]["cpu_pct"] < AIM_CPU_PCT and results[name]["rss_max_mb"] < AIM_RSS_MB
             for name in ("sqlite", "postgresql"))
    results["within_aims"] = ok
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"Idle cost over {args.seconds:.0f} s per run; {results['cpus']} CPUs, load average"
          f" {results['load_average_1m']:.2f}. Aims: < {AIM_CPU_PCT:.0f} % of one core,"
          f" < {AIM_RSS_MB:.0f} MB RSS.")
    labels = {"floor": "floor (imports, asleep)", "sqlite": "sqlite, poll 5 s",
              "postgresql": "postgresql, LISTEN, poll 5 s"}
    for name, label in labels.items():
        r = results[name]
        print(f"  {label:<30} CPU {r['cpu_pct']:6.3f} % of one core ({r['cpu_s']:.2f} s)"
              f"  RSS {r['rss_mb']:6.1f} MB (max {r['rss_max_mb']:.1f})")
    print("  within aims" if ok else "  NOT within aims")
    return 0


if __name__ == "__main__":
    sys.exit(main())
