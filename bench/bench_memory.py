"""Memory of the daemon after refusals and after many publishes.

One daemon on the embedded SQLite control plane (poll 0.1 s, Kubernetes off):

1. a 16 MB revision whose one key names an ``env:`` secret that is never set is
   made desired; it is refused (``secret``) and retried every poll. Peak
   (``VmHWM``) and current (``VmRSS``) resident memory are read after 1, 10 and
   50 refusals;
2. then ``--publishes`` revisions of about 1 MB, each valid, published one
   after another and each waited for; RSS after every hundred.

Printed beside a floor measured in the same run: the peak RSS of a bare
interpreter that imports msgspec and decodes the same 16 MB body once with a
plain ``msgspec.json.decode``. The aim is flat: after 50 refusals within 1.5x
of after 1, and after the publishes within 1.5x of after the first hundred.

    python bench/bench_memory.py [--publishes 1000] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mem(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / MIB
    raise RuntimeError(field)


def body(target: int, *, secret: str, tag: str) -> bytes:
    """A valid revision of about ``target`` bytes (within one alias of it)."""
    one = {"upstream": "https://a000000.internal.example/v1", "timeout_s": 30, "retries": 2}

    def build(count: int) -> bytes:
        doc = {"schema_version": 1,
               "aliases": {f"a{i:06d}": {**one, "upstream": f"https://{tag}{i}.example/v1"}
                           for i in range(count)},
               "keys": {"team": {"secret": secret, "aliases": ["a000000"]}}}
        return json.dumps(doc).encode()

    count = max(1, target // len(json.dumps({"a000000": one})))
    data = build(count)
    # The estimate's alias is longer than the real ones: scale once to the target.
    return build(max(1, count * target // len(data)))


def publish(db: Path, data: bytes) -> int:
    with sqlite3.connect(db) as conn:
        rid = conn.execute(
            "INSERT INTO supervisor_revisions (schema_version, body, body_sha256) VALUES (1, ?, ?)",
            (data, hashlib.sha256(data).digest())).lastrowid
        conn.execute("UPDATE supervisor_desired SET revision_id = ?", (rid,))
        # Keep the file small: older revisions are not needed here.
        conn.execute("DELETE FROM supervisor_revisions WHERE id < ? - 1", (rid,))
    assert rid is not None
    return rid


def status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=30) as r:
        return dict(json.load(r)["revision"])


def wait(predicate: Any, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.02)


def floor_peak(data: bytes, tmp: Path) -> float:
    path = tmp / "body.json"
    path.write_bytes(data)
    code = ("import msgspec, sys, pathlib; msgspec.json.decode(pathlib.Path(sys.argv[1])"
            ".read_bytes()); print(open('/proc/self/status').read())")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / MIB
    raise RuntimeError("VmHWM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishes", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        db, port = tmp / "cp.db", free_port()
        config = tmp / "supervisor.toml"
        config.write_text(f'[log]\nformat = "json"\n[control_plane]\nurl = "sqlite:///{db}"\n'
                          f'poll_interval_s = 0.1\n[admin]\nlisten = "127.0.0.1:{port}"\n')
        first = tmp / "first.toml"
        first.write_text('schema_version = 1\n[aliases.a]\nupstream = "https://a.example/"\n')
        subprocess.run([sys.executable, "-m", "supervisor", "publish", "--config", str(config),
                        str(first)], check=True, capture_output=True)
        big = body(16_000_000, secret="env:BENCH_NEVER_SET", tag="r")
        results["body_mib"] = round(len(big) / MIB, 2)
        results["body_bytes"] = len(big)
        results["floor_decode_peak_mib"] = round(floor_peak(big, tmp), 1)
        proc = subprocess.Popen([sys.executable, "-m", "supervisor", "--config", str(config)],
                                stderr=subprocess.DEVNULL, cwd=REPO)
        try:
            wait(lambda: _answers(port))
            results["idle_rss_mib"] = round(mem(proc.pid, "VmRSS"), 1)
            publish(db, big)
            for n in (1, 10, 50):
                wait(lambda n=n: status(port)["consecutive_failures"] >= n)
                results[f"after_{n}_refusals"] = {"peak_mib": round(mem(proc.pid, "VmHWM"), 1),
                                                  "rss_mib": round(mem(proc.pid, "VmRSS"), 1)}
            rss: list[float] = []
            for i in range(args.publishes):
                rid = publish(db, body(1_000_000, secret="env:HOME", tag=f"p{i}x"))
                wait(lambda rid=rid: status(port)["active"] == rid)
                if (i + 1) % 100 == 0:
                    rss.append(round(mem(proc.pid, "VmRSS"), 1))
            results["publishes_1mb_rss_mib_every_100"] = rss
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    one = results["after_1_refusals"]["peak_mib"]
    results["ratio_peak_50_vs_1"] = round(results["after_50_refusals"]["peak_mib"] / one, 2)
    results["ratio_peak_1_vs_floor"] = round(one / results["floor_decode_peak_mib"], 2)
    if results["publishes_1mb_rss_mib_every_100"]:
        series = results["publishes_1mb_rss_mib_every_100"]
        results["ratio_rss_last_vs_first_hundred"] = round(series[-1] / series[0], 2)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for key, value in results.items():
        print(f"{key:40} {value}")


def _answers(port: int) -> bool:
    try:
        status(port)
    except OSError:
        return False
    return True


if __name__ == "__main__":
    main()
