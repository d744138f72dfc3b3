"""``publish --wait`` end to end on PostgreSQL with LISTEN, next to the daemon's own figure.

A scratch database (created here, dropped at the end), one daemon (LISTEN on,
polling once a minute so only the notification or the converge request can be
fast), and ``--iterations`` runs of the console script::

    trio-supervisor publish --config CFG rev-N.toml --wait --url http://127.0.0.1:PORT

each publishing a new revision. Per run, in this process's monotonic clock:

- ``commit``: when the script's "published revision N" line arrives (the
  script prints it right after the commit returned);
- ``active``: when the script's "revision N active" line arrives (its verdict);
- ``exit``: when the script has exited (0 expected).

Reports p50/p99 of commit -> exit (what ``--wait`` adds after the commit),
commit -> the "revision N active" line (the verdict, before the interpreter's
own teardown), and the whole run (interpreter start to exit, what a pipeline
step costs). The daemon's own commit-to-published with LISTEN is
``bench/bench_convergence.py``'s figure (the floor ``--wait`` cannot beat); the
daemon's ``published`` line is still awaited here, so every run is checked.

    .venv/bin/python bench/bench_publish_wait.py [--dsn DSN] [--iterations 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.pgserver

from tests import pgserver

SCRIPT = str(Path(sys.executable).parent / "trio-supervisor")


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return {"n": len(ms), "p50_ms": round(cuts[49], 2), "p99_ms": round(cuts[98], 2),
            "max_ms": round(ms[-1], 2)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DaemonLog(threading.Thread):
    """Reads the daemon's JSON log lines; remembers when each revision was published."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.published: dict[int, float] = {}
        self.ready = threading.Event()
        self.changed = threading.Condition()

    def run(self) -> None:
        for raw in self.stream:
            now = time.monotonic()
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if line.get("event") == "ready":
                self.ready.set()
            if line.get("event") == "published" and isinstance(line.get("revision"), int):
                with self.changed:
                    self.published[line["revision"]] = now
                    self.changed.notify_all()

    def wait_for(self, revision: int, timeout_s: float = 30) -> float:
        with self.changed:
            if not self.changed.wait_for(lambda: revision in self.published, timeout_s):
                raise RuntimeError(f"revision {revision} was never published")
            return self.published[revision]


def one_run(config: Path, document: Path,
            url: str) -> tuple[int, float, float, float, float]:
    start = time.monotonic()
    proc = subprocess.Popen([SCRIPT, "publish", "--config", str(config), str(document),
                             "--wait", "--url", url, "--timeout", "30"],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    commit = verdict = None
    revision = None
    for line in proc.stdout:
        if line.startswith("published revision ") and commit is None:
            commit = time.monotonic()
            revision = int(line.split()[2].rstrip(","))  # published revision N to ...
        elif line.rstrip().endswith(" active") and verdict is None:
            verdict = time.monotonic()
    code = proc.wait()
    done = time.monotonic()
    if code != 0 or commit is None or revision is None or verdict is None:
        raise RuntimeError(f"publish --wait exited {code}")
    return revision, start, commit, verdict, done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="maintenance database DSN (default: the tests' server, "
                        "tests/pgserver.py: SUPERVISOR_TEST_PG, 127.0.0.1:5432, else its own)")
    parser.add_argument("--iterations", type=int, default=50, help="runs measured")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.dsn = pgserver.for_script(args.dsn).dsn
    dbname = f"bench_wait_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    url = f"{args.dsn.rpartition('/')[0]}/{dbname}"
    daemon = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            port = free_port()
            config = Path(tmp) / "supervisor.toml"
            config.write_text(f'[log]\nformat = "json"\n[control_plane]\nurl = "{url}"\n'
                              f'poll_interval_s = 60\n[admin]\nlisten = "127.0.0.1:{port}"\n')
            docs = []
            for i in range(args.iterations + 1):
                doc = Path(tmp) / f"rev-{i}.toml"
                doc.write_text(f'schema_version = 1\n[aliases.chat]\nupstream = '
                               f'"https://llm.internal/v1"\ntimeout_s = {i + 1}\n')
                docs.append(doc)
            subprocess.run([SCRIPT, "db", "migrate", "--config", str(config)], check=True,
                           capture_output=True)
            subprocess.run([SCRIPT, "publish", "--config", str(config), str(docs[0])],
                           check=True, capture_output=True)
            daemon = subprocess.Popen([SCRIPT, "run", "--config", str(config)],
                                      stderr=subprocess.PIPE, text=True)
            log = DaemonLog(daemon.stderr)
            log.start()
            if not log.ready.wait(30):
                raise RuntimeError("the daemon never became ready")
            base = f"http://127.0.0.1:{port}"
            to_exit, to_verdict, whole = [], [], []
            for doc in docs[1:]:
                revision, start, commit, verdict, done = one_run(config, doc, base)
                log.wait_for(revision)
                to_exit.append(done - commit)
                to_verdict.append(verdict - commit)
                whole.append(done - start)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(10)
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    result = {"commit_to_exit": summary(to_exit), "commit_to_active_line": summary(to_verdict),
              "whole_run": summary(whole)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for name, figures in result.items():
        print(f"{name:28s} p50 {figures['p50_ms']:8.2f} ms  p99 {figures['p99_ms']:8.2f} ms  "
              f"max {figures['max_ms']:8.2f} ms  (n={figures['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
