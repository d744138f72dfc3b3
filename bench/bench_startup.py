"""Process start to READY=1, and SIGTERM to exit, on the embedded default (SQLite).

    python bench/bench_startup.py [--runs 10]

Prints the median and max of each over the runs, next to two floors measured in
the same run, each run interleaved with the daemon's so that a loaded machine
slows all alike: the same interpreter importing nothing (``python -c pass``) and
importing what every configuration needs (``import trio, msgspec, structlog``).
The package is byte-compiled first (as an installed one is, and as the floor's
packages are), whatever ``PYTHONDONTWRITEBYTECODE`` says. Aims: start to READY at
most 1.5x the import floor; SIGTERM to exit under 150 ms
when idle. The load average is printed with the figures.
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
#: Every process here reads the byte-compiled package, none compiles it again.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: What every configuration imports: the floor start to READY is measured against.
FLOOR_IMPORTS = "import trio, msgspec, structlog"


def timed(code: str) -> float:
    """Seconds for a fresh interpreter to run ``code`` (an import floor)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=ENV)
    return time.perf_counter() - start


def one_run(config: Path, notify_path: Path) -> tuple[float, float]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.settimeout(30)
    env = {**ENV, "NOTIFY_SOCKET": str(notify_path)}
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
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "supervisor")],
                   check=True, env=ENV)
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
        bare: list[float] = []
        floors: list[float] = []
        results = []
        for _ in range(args.runs):
            bare.append(timed("pass"))
            floors.append(timed(FLOOR_IMPORTS))
            results.append(one_run(config, directory / "notify"))
    ready = [r for r, _ in results]
    stop = [s for _, s in results]
    floor = statistics.median(floors)
    print(f"runs: {args.runs}; load average {' '.join(map(str, os.getloadavg()))}")
    print(f"floor (python -c pass):   median {statistics.median(bare) * 1000:7.1f} ms")
    print(f"floor ({FLOOR_IMPORTS}): median {floor * 1000:7.1f} ms")
    print(
        f"start to READY=1:         median {statistics.median(ready) * 1000:7.1f} ms  "
        f"max {max(ready) * 1000:7.1f} ms  ({statistics.median(ready) / floor:.2f}x the "
        f"import floor; aim <= 1.5x)"
    )
    print(
        f"SIGTERM to exit:          median {statistics.median(stop) * 1000:7.1f} ms  "
        f"max {max(stop) * 1000:7.1f} ms  (aim < 150 ms)"
    )


if __name__ == "__main__":
    main()
