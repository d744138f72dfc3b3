"""Admin API throughput and stream fan-out latency.

Run from the repository root::

    python bench/bench_admin.py [--requests 5000] [--concurrency 50]
                                [--stream-clients 1000] [--publishes 7]

The server runs in this process (serve_admin on a free loopback port, with a real
:class:`~supervisor.revision.snapshot.Snapshot` when that module is present); the
clients run in child processes so that they do not share the server's event loop
(they are Python too, so the figures are lower bounds for the server):

1. ``GET /status`` and ``GET /v1/snapshot``: requests per second with
   ``--concurrency`` concurrent httpx clients (one ``AsyncClient`` each, keep-alive)
   making ``--requests`` requests in all; p50/p99 latency.
2. ``WS /v1/stream``: ``--stream-clients`` trio-websocket clients; each publish
   carries its ``time.monotonic()`` (system-wide on Linux, so comparable across
   processes), and the figure is the time until the *last* client has the event;
   p50 (and max) over ``--publishes`` publishes, each sent after the previous one
   reached every client.

Each figure is printed beside its floor, the value below (or above, for a
latency) which something has regressed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import trio

FLOOR_STATUS_RPS = 300.0
FLOOR_SNAPSHOT_RPS = 200.0
FLOOR_STREAM_P50_MS = 500.0


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- children ---------------------------------------------------------------------


async def http_client(url: str, requests: int, concurrency: int) -> None:
    import httpx

    remaining = requests
    latencies: list[float] = []
    failures = 0

    async def worker() -> None:
        nonlocal remaining, failures
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            while remaining > 0:
                remaining -= 1
                start = time.perf_counter()
                response = await client.get(url)
                latencies.append(time.perf_counter() - start)
                if response.status_code != 200:
                    failures += 1

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    wall = time.perf_counter() - start
    latencies.sort()
    print(
        json.dumps(
            {
                "rps": len(latencies) / wall,
                "p50_ms": 1000 * latencies[len(latencies) // 2],
                "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
                "failures": failures,
            }
        ),
        flush=True,
    )


async def stream_client(url: str, clients: int, publishes: int) -> None:
    import msgspec
    from trio_websocket import open_websocket_url

    connect_limit = trio.Semaphore(50)  # stay within the server's listen backlog
    ready = 0
    arrived: dict[int, list[float]] = {}

    async def one() -> None:
        nonlocal ready
        async with connect_limit:
            ws_cm = open_websocket_url(url, connect_timeout=60)
            ws = await ws_cm.__aenter__()
        try:
            await ws.get_message()  # the status message
            ready += 1
            if ready == clients:
                print(json.dumps({"ready": True}), flush=True)
            got = 0
            while got < publishes:
                doc = msgspec.json.decode(await ws.get_message())
                if doc.get("type") != "published":
                    continue
                now = time.monotonic()
                seen = arrived.setdefault(doc["seq"], [])
                seen.append(now - doc["took_s"])
                got += 1
                if len(seen) == clients:
                    print(
                        json.dumps(
                            {
                                "seq": doc["seq"],
                                "last_ms": 1000 * max(seen),
                                "first_ms": 1000 * min(seen),
                            }
                        ),
                        flush=True,
                    )
        finally:
            await ws_cm.__aexit__(None, None, None)

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one)


# -- the orchestrating process ----------------------------------------------------


def make_snapshot(aliases: int, keys: int) -> Any:
    body = {
        "aliases": {
            f"alias-{i}": {
                "upstream": f"https://llm-{i}.internal:8443/v1",
                "timeout_s": 30.0,
                "retries": 2,
            }
            for i in range(aliases)
        },
        "keys": {
            f"team-{i}": {"digest": f"{i:064x}", "aliases": [f"alias-{i % aliases}"]}
            for i in range(keys)
        },
    }
    try:
        from supervisor.revision.document import AliasSpec
        from supervisor.revision.snapshot import KeyEntry, Snapshot

        return Snapshot(
            revision=7,
            generation=1,
            aliases={k: AliasSpec(**v) for k, v in body["aliases"].items()},
            keys={k: KeyEntry(v["digest"], tuple(v["aliases"])) for k, v in body["keys"].items()},
        )
    except ImportError:
        import msgspec

        class Stand:
            revision, generation = 7, 1

            def to_json(self) -> bytes:
                return msgspec.json.encode({"revision": 7, "generation": 1, **body})

            def etag(self) -> str:
                return '"7-1"'

        return Stand()


async def _lines(stream: trio.abc.ReceiveStream) -> Any:
    buffer = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)


def _child(*args: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), *args]


async def orchestrate(args: argparse.Namespace) -> None:
    from supervisor.admin.context import AdminContext
    from supervisor.admin.server import serve_admin
    from supervisor.admin.stream import StreamSettings
    from supervisor.convergence.status import RevisionStatus
    from supervisor.events import EventBus, Published
    from supervisor.sinks.state import ActiveState, Candidate, Serving
    from supervisor.status_doc import ChildReport
    from supervisor.telemetry import Metrics

    state = ActiveState()
    ctx = AdminContext(
        state=state,
        revision=RevisionStatus(state),
        events=EventBus(),
        metrics=Metrics(),
        children=lambda: {"convergence": ChildReport(state="running", restarts=0,
                                                     last_error=None)},
    )
    snapshot = make_snapshot(args.aliases, args.keys)
    ctx.state.serve(Serving(snapshot, Candidate(snapshot.revision, b"", b"{}", 1)))
    settings = StreamSettings(max_clients=max(4096, args.stream_clients))
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_admin(
                ctx, "127.0.0.1:0", settings=settings, task_status=task_status
            )
        )
        base = f"http://{host}:{port}"
        print(
            f"admin API on {base}; snapshot body {len(snapshot.to_json())} bytes "
            f"({args.aliases} aliases, {args.keys} keys)"
        )

        for path, floor in (("/status", FLOOR_STATUS_RPS), ("/v1/snapshot", FLOOR_SNAPSHOT_RPS)):
            result = await trio.run_process(
                _child("--http-client", base + path, str(args.requests), str(args.concurrency)),
                capture_stdout=True,
            )
            r = json.loads(result.stdout)
            print(
                f"GET {path:<13} {r['rps']:8.0f} req/s  (floor {floor:.0f})   "
                f"p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms  "
                f"[{args.requests} requests, {args.concurrency} clients, "
                f"{r['failures']} failures]"
            )

        process = await trio.lowlevel.open_process(
            _child(
                "--stream-client",
                f"ws://{host}:{port}/v1/stream",
                str(args.stream_clients),
                str(args.publishes),
            ),
            stdout=subprocess.PIPE,
        )
        assert process.stdout is not None
        lines = _lines(process.stdout)
        start = time.monotonic()
        assert (await lines.__anext__())["ready"]
        print(f"{args.stream_clients} stream clients connected in {time.monotonic() - start:.1f} s")
        last_ms: list[float] = []
        for _ in range(args.publishes):
            # took_s carries the send time (the monotonic clock is the machine's):
            # a client's latency counts from there.
            event = ctx.events.emit(Published(revision=7, generation=1, source="bench",
                                              took_s=time.monotonic()))
            report = await lines.__anext__()
            assert report["seq"] == event.seq
            last_ms.append(report["last_ms"])
        await process.wait()
        print(
            f"publish -> last of {args.stream_clients} clients: "
            f"p50 {statistics.median(last_ms):.1f} ms  (floor {FLOOR_STREAM_P50_MS:.0f} ms)   "
            f"max {max(last_ms):.1f} ms  [{args.publishes} publishes; "
            f"dropped clients {ctx.metrics.stream_dropped._value.get():.0f}]"
        )
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--stream-clients", type=int, default=1000)
    parser.add_argument("--publishes", type=int, default=7)
    parser.add_argument("--aliases", type=int, default=50)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--http-client", nargs=3, metavar=("URL", "REQUESTS", "CONCURRENCY"))
    parser.add_argument("--stream-client", nargs=3, metavar=("URL", "CLIENTS", "PUBLISHES"))
    args = parser.parse_args()
    _raise_fd_limit()
    if args.http_client:
        url, requests, concurrency = args.http_client
        trio.run(http_client, url, int(requests), int(concurrency))
    elif args.stream_client:
        url, clients, publishes = args.stream_client
        trio.run(stream_client, url, int(clients), int(publishes))
    else:

        from supervisor.logs import configure

        configure("warning", "console")
        trio.run(orchestrate, args)


if __name__ == "__main__":
    main()
