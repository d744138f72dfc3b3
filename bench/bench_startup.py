"""Process start to READY=1, and SIGTERM to exit, on the embedded default (SQLite).

    python bench/bench_startup.py [--runs 10]

Prints the median and max of each over the runs, next to a floor measured in the
same run: the time for the same interpreter to start and import nothing
(``python -c pass``). Aims: start to READY under 0.8 s, SIGTERM to exit under
150 ms when idle.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(config: Path, notify_path: Path) -> tuple[float, float]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path)}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "--config", str(config)],
        env=env,
        cwd=REPO,
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        while b"READY=1" not in sock.recv(65536):
            pass
        ready = time.perf_counter() - start
        stop = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        stopped = time.perf_counter() - stop
        if code != 0:
            raise SystemExit(f"daemon exited {code}")
        return ready, stopped
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
        notify_path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        config = directory / "bench.toml"
        config.write_text(
            f'[log]\nformat = "json"\n[control_plane]\nurl = "sqlite:///{directory}/cp.db"\n'
            f'[admin]\nlisten = "127.0.0.1:{free_port()}"\n'
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "supervisor",
                "publish",
                "--config",
                str(config),
                str(REPO / "conf" / "example-revision.toml"),
            ],
            check=True,
            cwd=REPO,
            capture_output=True,
        )
        floors = []
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            floors.append(time.perf_counter() - t)
        results = [one_run(config, directory / "notify") for _ in range(args.runs)]
    ready = [r for r, _ in results]
    stop = [s for _, s in results]
    floor = statistics.median(floors)
    print(f"runs: {args.runs}")
    print(f"floor (python -c pass):   median {floor * 1000:7.1f} ms")
    print(
        f"start to READY=1:         median {statistics.median(ready) * 1000:7.1f} ms  "
        f"max {max(ready) * 1000:7.1f} ms  ({statistics.median(ready) / floor:.1f}x floor; "
        f"aim < 800 ms)"
    )
    print(
        f"SIGTERM to exit:          median {statistics.median(stop) * 1000:7.1f} ms  "
        f"max {max(stop) * 1000:7.1f} ms  (aim < 150 ms)"
    )


if __name__ == "__main__":
    main()
