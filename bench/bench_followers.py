"""Follower fan-out: publish on the upstream -> the last of N followers active.

One upstream replica (SQLite control plane, poll 0.2 s) and N follower
processes (``[control_plane].url`` = the upstream's admin address), all on this
machine. The bench follows every follower's ``/v1/stream`` (trio-websocket)
and, for each of ``--publishes`` publishes made in-process on the upstream's
store, measures from just before the commit to the ``published`` event of the
last follower. Two runs: with the upstream's stream as the wake-up hint
(``listen = true``) and polling only (``listen = false``, ``--poll`` seconds).
Also reported: each follower's RSS after the run (``/proc/PID/status`` VmRSS).

The floor beside it: the upstream's own publish (commit -> the upstream's own
``published`` event), which every follower must wait for.

    python bench/bench_followers.py [--followers 50] [--publishes 20] [--poll 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio
from trio_websocket import open_websocket_url

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.factory import open_admin
from supervisor.revision.document import SCHEMA_VERSION
from supervisor.sinks.lkg import generate_signing_key

REPO = Path(__file__).resolve().parents[1]
BODY = b'{"schema_version": 1, "aliases": {"a": {"upstream": "https://a.example/"}}}'


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_node(root: Path, name: str, url: str, trusted: list[str], *, poll: float,
               listen: bool, ttl_s: float = 300.0) -> tuple[Path, int]:
    directory = root / name
    directory.mkdir()
    key = directory / "key"
    verify = generate_signing_key(str(key))
    port = free_port()
    config = directory / "supervisor.toml"
    # A follower trusts the root's keys for what it receives, its own for its cache.
    upstream = f"trusted_keys = {json.dumps(trusted)}\n" if trusted else ""
    config.write_text(
        f'[log]\nlevel = "warning"\nformat = "json"\n'
        f'[control_plane]\nurl = "{url}"\npoll_interval_s = {poll}\n'
        f"listen = {'true' if listen else 'false'}\n{upstream}"
        f'[cache]\npath = "{directory}/cache/lkg.bin"\nsigning_key = "{key}"\n'
        f"trusted_keys = {json.dumps([verify])}\nstatement_ttl_s = {ttl_s}\n"
        f'[admin]\nlisten = "127.0.0.1:{port}"\n')
    (directory / "verify").write_text(verify)
    return config, port


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def wait_ready(port: int) -> None:
    import httpx

    async with httpx.AsyncClient() as http:
        while True:
            try:
                if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await trio.sleep(0.05)


async def _statuses(ports: list[int]) -> list[Any]:
    import httpx

    out: list[Any] = []
    async with httpx.AsyncClient() as http:
        for port in ports[:3]:
            try:
                out.append((await http.get(f"http://127.0.0.1:{port}/status")).json()["revision"])
            except (httpx.HTTPError, ValueError) as exc:
                out.append(repr(exc))
    return out


async def run(followers: int, publishes: int, poll: float, listen: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-followers-") as tmp:
        root = Path(tmp)
        db = f"sqlite:///{root}/cp.db"
        up_config, up_port = write_node(root, "upstream", db, [], poll=0.2, listen=True)
        store = open_admin(ControlPlaneConfig(url=db), max_schema_version=SCHEMA_VERSION)
        await store.migrate()
        await store.publish(BODY, 1, "bench")
        trusted = [(root / "upstream" / "verify").read_text()]
        procs: list[subprocess.Popen[bytes]] = []

        def start(config: Path) -> None:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "supervisor", "--config", str(config)],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        try:
            start(up_config)
            await wait_ready(up_port)
            ports = []
            for i in range(followers):
                config, port = write_node(root, f"f{i}", f"http://127.0.0.1:{up_port}", trusted,
                                          poll=poll, listen=listen)
                start(config)
                ports.append(port)
            for port in ports:
                await wait_ready(port)
            latencies: list[float] = []
            floors: list[float] = []
            seen: dict[int, dict[int, float]] = {}
            async with trio.open_nursery() as nursery:

                connected: set[int] = set()

                async def follow(port: int) -> None:
                    url = f"ws://127.0.0.1:{port}/v1/stream"
                    async with open_websocket_url(url, connect_timeout=60) as ws:
                        await ws.get_message()  # the status: subscribed from here on
                        connected.add(port)
                        while True:
                            event = json.loads(await ws.get_message())
                            if event.get("type") == "published":
                                revision = int(event.get("revision", 0))
                                seen.setdefault(revision, {})[port] = trio.current_time()

                for port in [up_port, *ports]:
                    nursery.start_soon(follow, port)
                # Every stream connected and past its first message (51 processes
                # starting on a small machine can take far longer than a second).
                with trio.move_on_after(120):
                    while len(connected) < followers + 1:
                        await trio.sleep(0.05)
                missing = sorted(set([up_port, *ports]) - connected)
                if missing:
                    raise RuntimeError(f"no first stream message from ports {missing} "
                                       f"(upstream {up_port})")
                for _ in range(publishes):
                    start_at = trio.current_time()
                    revision = await store.publish(BODY, 1, "bench")
                    with trio.move_on_after(max(30.0, 3 * poll)):
                        while len(seen.get(revision, {})) < followers + 1:
                            await trio.sleep(0.005)
                    late = sorted(set([up_port, *ports]) - set(seen.get(revision, {})))
                    if late:
                        raise RuntimeError(f"revision {revision} not published by ports {late} "
                                           f"(upstream {up_port}): {await _statuses(late)}")
                    times = seen[revision]
                    floors.append(times[up_port] - start_at)
                    latencies.append(max(times[p] for p in ports) - start_at)
                nursery.cancel_scope.cancel()
            rss = [rss_kib(p.pid) for p in procs[1:]]
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()
            await store.aclose()

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000

    return {
        "mode": "stream hint" if listen else f"polling only ({poll:g} s)",
        "last_follower_p50_ms": pct(latencies, 0.5), "last_follower_p99_ms": pct(latencies, 0.99),
        "upstream_floor_p50_ms": pct(floors, 0.5),
        "rss_per_follower_mib": statistics.mean(rss) / 1024,
    }


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def refresh_cost(followers: int, ttl_s: float, window_s: float) -> tuple[float, int]:
    """(the root's CPU seconds over ``window_s``, statements it signed) with N polling followers.

    Followers poll every second without the stream; the root re-signs every
    ``ttl_s / 2`` and every follower then fetches the new statement once.
    """
    import httpx

    with tempfile.TemporaryDirectory(prefix="bench-refresh-") as tmp:
        root = Path(tmp)
        db = f"sqlite:///{root}/cp.db"
        up_config, up_port = write_node(root, "upstream", db, [], poll=0.2, listen=True,
                                        ttl_s=ttl_s)
        store = open_admin(ControlPlaneConfig(url=db), max_schema_version=SCHEMA_VERSION)
        await store.migrate()
        await store.publish(BODY, 1, "bench")
        await store.aclose()
        trusted = [(root / "upstream" / "verify").read_text()]
        procs: list[subprocess.Popen[bytes]] = []

        def start(config: Path) -> None:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "supervisor", "--config", str(config)],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        try:
            start(up_config)
            await wait_ready(up_port)
            ports = []
            for i in range(followers):
                config, port = write_node(root, f"f{i}", f"http://127.0.0.1:{up_port}", trusted,
                                          poll=1.0, listen=False)
                start(config)
                ports.append(port)
            with trio.fail_after(300):
                for port in ports:
                    await wait_ready(port)
            await trio.sleep(5)  # past the start-up work
            seen: set[str] = set()
            before = cpu_s(procs[0].pid)
            async with httpx.AsyncClient() as http:
                with trio.move_on_after(window_s):
                    while True:
                        report = (await http.get(f"http://127.0.0.1:{up_port}/status")).json()
                        seen.add(report["revision"]["statement"]["issued_at"])
                        await trio.sleep(0.1)
            used = cpu_s(procs[0].pid) - before
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()
    return used, len(seen) - 1


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--followers", type=int, default=50)
    parser.add_argument("--publishes", type=int, default=20)
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--refresh-window", type=float, default=60.0)
    parser.add_argument("--refresh-only", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    for listen in (True, False):
        if args.refresh_only:
            break
        result = await run(args.followers, args.publishes, args.poll, listen)
        print(json.dumps(result))
    # Statement refresh: the root's CPU with a 10 s TTL (a new statement every ~5 s) minus
    # with a TTL of a day (none), per statement and follower, scaled to the default TTL.
    # (Shorter TTLs leave a cold follower on a loaded machine an expired statement at boot.)
    base, _ = await refresh_cost(args.followers, 86400.0, args.refresh_window)
    busy, signed = await refresh_cost(args.followers, 10.0, args.refresh_window)
    per_refresh_ms = max(0.0, busy - base) / max(1, signed) / args.followers * 1000
    print(json.dumps({
        "mode": "statement refresh", "root_cpu_s_no_refresh": round(base, 3),
        "root_cpu_s_refreshing": round(busy, 3), "statements_signed": signed,
        "root_cpu_ms_per_follower_per_refresh": round(per_refresh_ms, 3),
        "root_cpu_ms_per_follower_per_hour_at_300s_ttl": round(per_refresh_ms * 3600 / 150, 2),
    }))


if __name__ == "__main__":
    trio.run(main)
