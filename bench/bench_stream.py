"""The stream at scale: publish -> the last of N WebSocket subscribers, beside a bare floor.

Run from the repository root::

    python bench/bench_stream.py [--sizes 1000,10000] [--publishes 50]
                                 [--per-process 500]

For each size N, two servers, each in its own process, serve the same client
processes (``--per-process`` subscribers each, a raw-socket WebSocket client
written here so that the clients cost both servers the same):

- ``floor``: a bare trio-websocket broadcast server: one task and one bounded
  queue per connection, the event encoded once and the same text handed to
  every queue, ``send_message`` per connection. Nothing else: no HTTP server,
  no ASGI, no event bus.
- ``ours``: the daemon's admin API (``serve_admin``: the accept loop, its own
  HTTP/1.1 and WebSocket protocol over h11 and wsproto, the stream hub) fed by the event bus, with
  the stream client limit derived from the descriptor limit (the server raises
  its soft RLIMIT_NOFILE to the hard one, as the daemon does).

Each publish is timed from just before the orchestrator tells the server to
publish (a line on its stdin) until the last subscriber, over all client
processes, has read the event (``time.monotonic()`` is system-wide on Linux,
so comparable across processes). p50 and p99 over ``--publishes`` publishes
(after 3 warm-up ones; each after the previous one reached everybody), printed
with the ratio ours/floor. Memory: the server process's RSS once all N are
connected minus its RSS before the first, per subscriber.

``--gc-threshold 50000,20,10`` sets ``gc.set_threshold`` in every process: with
thousands of connections the cyclic collector's full collections, triggered by
the temporaries of each fan-out, dominate both servers' CPU.

Every process raises its soft RLIMIT_NOFILE to the hard one; 10,000
subscribers need a hard limit of about 13,100 for ``ours`` (``ulimit -Hn``).
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

import msgspec
import trio

MAX_BUFFER = 256  # the hub's default per-client buffer, for the floor too
CONNECT_CONCURRENCY = 16  # handshakes in flight per client process
HANDSHAKE_ATTEMPTS = 10


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def event_payload(n: int) -> dict[str, Any]:
    # The keys of the daemon's "published" event (supervisor.events.Published): the
    # revision is 1000 + n, so a client knows n.
    return {"revision": 1000 + n, "generation": 1, "source": "control_plane", "took_s": 0.0032}


class PublishProfile:
    """With BENCH_STREAM_PROFILE=PREFIX, cProfile the server from its first publish
    on, written to PREFIX.KIND when its stdin closes (an investigation aid)."""

    def __init__(self, kind: str) -> None:
        import cProfile

        self.path = os.environ.get("BENCH_STREAM_PROFILE")
        self.profiler = cProfile.Profile() if self.path else None
        self.kind = kind
        self.started = False

    def publishing(self) -> None:
        if self.profiler is not None and not self.started:
            self.started = True
            self.profiler.enable()

    def done(self) -> None:
        if self.profiler is not None and self.started:
            self.profiler.disable()
            self.profiler.dump_stats(f"{self.path}.{self.kind}")


async def stdin_lines() -> Any:
    stream = trio.lowlevel.FdStream(os.dup(0))
    buffer = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode()


# -- the floor: bare trio-websocket broadcast --------------------------------------


async def floor_server() -> None:
    from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

    queues: set[trio.MemorySendChannel[str]] = set()
    hello = msgspec.json.encode({"type": "status", "revision": 1000}).decode()
    seq = 0

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        send, receive = trio.open_memory_channel[str](MAX_BUFFER)
        queues.add(send)
        try:
            await ws.send_message(hello)
            async for text in receive:
                await ws.send_message(text)
        except ConnectionClosed:
            pass
        finally:
            queues.discard(send)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            lambda task_status: serve_websocket(
                handler, "127.0.0.1", 0, ssl_context=None, task_status=task_status
            )
        )
        port = listeners.port
        print(json.dumps({"port": port}), flush=True)
        profile = PublishProfile("floor")
        async for line in stdin_lines():
            profile.publishing()
            seq += 1
            event = {"type": "published", "seq": seq, "at": "2026-01-01T00:00:00Z",
                     **event_payload(int(line))}
            text = msgspec.json.encode(event).decode()
            for queue in list(queues):
                try:
                    queue.send_nowait(text)
                except trio.WouldBlock:
                    queues.discard(queue)
                    queue.close()
        profile.done()
        nursery.cancel_scope.cancel()


# -- ours: the admin API ---------------------------------------------------------


async def our_server() -> None:

    from supervisor.admin.context import AdminContext
    from supervisor.admin.server import serve_admin
    from supervisor.convergence.status import RevisionStatus
    from supervisor.events import EventBus, Published
    from supervisor.logs import configure
    from supervisor.sinks.state import ActiveState
    from supervisor.status_doc import ChildReport
    from supervisor.telemetry import Metrics

    configure("warning", "console")
    state = ActiveState()
    ctx = AdminContext(
        state=state,
        revision=RevisionStatus(state),
        events=EventBus(),
        metrics=Metrics(),
        children=lambda: {"convergence": ChildReport(state="running", restarts=0,
                                                     last_error=None)},
    )
    async with trio.open_nursery() as nursery:
        _host, port = await nursery.start(
            lambda task_status: serve_admin(ctx, "127.0.0.1:0", task_status=task_status)
        )
        print(json.dumps({"port": port}), flush=True)
        profile = PublishProfile("ours")
        async for line in stdin_lines():
            profile.publishing()
            ctx.events.emit(Published(**event_payload(int(line))))
        profile.done()
        nursery.cancel_scope.cancel()


# -- the client processes ----------------------------------------------------------


def _handshake(port: int) -> bytes:
    return (
        f"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def _frames(buffer: bytearray) -> list[tuple[int, bytes]]:
    """Complete frames at the front of ``buffer`` (removed from it): (opcode, payload).
    Server frames are unmasked; messages this small are never fragmented."""
    out = []
    while len(buffer) >= 2:
        opcode = buffer[0] & 0x0F
        length = buffer[1] & 0x7F
        offset = 2
        if length == 126:
            if len(buffer) < 4:
                break
            length = int.from_bytes(buffer[2:4], "big")
            offset = 4
        elif length == 127:
            if len(buffer) < 10:
                break
            length = int.from_bytes(buffer[2:10], "big")
            offset = 10
        if len(buffer) < offset + length:
            break
        out.append((opcode, bytes(buffer[offset : offset + length])))
        del buffer[: offset + length]
    return out


async def clients(port: int, count: int) -> None:
    """``count`` subscribers; prints {"ready": ...} once every one has its first
    message, then for each published n, once all have it, the latest arrival."""
    connect_limit = trio.Semaphore(CONNECT_CONCURRENCY)
    ready = 0
    seen: dict[int, list[float]] = {}  # n -> [count, first arrival, last arrival]
    failed: list[str] = []
    retries: list[int] = []
    all_ready = trio.Event()

    async def handshake() -> tuple[trio.SocketStream, bytes]:
        # A refused or reset handshake (the server sheds connections that have
        # not sent their request head within its idle deadline when it is this
        # busy) is retried, as the daemon's own stream clients do; counted.
        for attempt in range(HANDSHAKE_ATTEMPTS):
            if attempt:
                retries.append(1)
                await trio.sleep(0.2 * attempt)
            try:
                async with connect_limit:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    await stream.send_all(_handshake(port))
                    head = b""
                    while b"\r\n\r\n" not in head:
                        chunk = await stream.receive_some(65536)
                        if not chunk:
                            raise trio.BrokenResourceError("closed during the handshake")
                        head += chunk
            except (OSError, trio.BrokenResourceError):
                continue
            status, rest = head.split(b"\r\n\r\n", 1)
            if status.startswith(b"HTTP/1.1 101"):
                return stream, rest
            await stream.aclose()
        raise RuntimeError("handshake failed")

    async def one() -> None:
        nonlocal ready
        try:
            stream, rest = await handshake()
        except RuntimeError as exc:
            failed.append(str(exc))
            return
        buffer = bytearray(rest)
        first = True
        while True:
            frames = _frames(buffer)
            now = time.monotonic()
            for opcode, payload in frames:
                if opcode == 8:
                    return
                if opcode != 1:
                    continue
                if first:
                    first = False
                    ready += 1
                    if ready == count:
                        all_ready.set()
                    continue
                doc = msgspec.json.decode(payload)
                if doc.get("type") != "published":
                    continue
                n = doc["revision"] - 1000
                entry = seen.setdefault(n, [0, now, now])
                entry[0] += 1
                entry[2] = max(entry[2], now)
                if entry[0] == count:
                    print(json.dumps({"n": n, "first": entry[1], "last": entry[2]}),
                          flush=True)
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            buffer += chunk

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
        with trio.move_on_after(300):
            while not all_ready.is_set() and not failed:
                await trio.sleep(0.05)
        print(json.dumps({"ready": ready, "failed": failed[:3], "failures": len(failed),
                          "retries": len(retries)}), flush=True)
        # Until the orchestrator closes our stdin.
        async for _ in stdin_lines():
            pass
        nursery.cancel_scope.cancel()


# -- the orchestrator --------------------------------------------------------------


def _child(*args: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), *args]


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


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_one(kind: str, size: int, per_process: int, publishes: int) -> dict[str, Any]:
    command = _child("--server", kind)
    server = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert server.stdin is not None and server.stdout is not None
    server_lines = _lines(server.stdout)
    port = (await server_lines.__anext__())["port"]
    await trio.sleep(0.5)
    rss_before = rss_kib(server.pid)
    procs = []
    remaining = size
    while remaining > 0:
        n = min(per_process, remaining)
        remaining -= n
        proc = await trio.lowlevel.open_process(
            _child("--clients", str(port), str(n)), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        procs.append(proc)
    readers = []
    retries = 0
    start = time.monotonic()
    for proc in procs:
        assert proc.stdout is not None
        reader = _lines(proc.stdout)
        report = await reader.__anext__()
        if report["failures"]:
            raise RuntimeError(f"{kind}: {report['failures']} clients failed: {report['failed']}")
        retries += report["retries"]
        readers.append(reader)
    connected_s = time.monotonic() - start
    await trio.sleep(1.0)  # let the last handshakes' garbage settle
    rss_after = rss_kib(server.pid)
    latencies: list[float] = []
    cpu_before = cpu_s(server.pid)
    for n in range(-3, publishes):
        t0 = time.monotonic()
        await server.stdin.send_all(f"{n}\n".encode())
        last = 0.0
        for reader in readers:
            report = await reader.__anext__()
            assert report["n"] == n, report
            last = max(last, report["last"])
        if n >= 0:
            latencies.append(1000 * (last - t0))
        await trio.sleep(0.02)
    cpu_per_publish_ms = 1000 * (cpu_s(server.pid) - cpu_before) / (publishes + 3)
    for proc in procs:
        assert proc.stdin is not None
        await proc.stdin.aclose()
    for proc in procs:
        await proc.wait()
    await server.stdin.aclose()
    with trio.move_on_after(10):
        await server.wait()
    if server.returncode is None:
        server.kill()
        await server.wait()
    return {
        "kind": kind,
        "size": size,
        "connected_s": connected_s,
        "handshake_retries": retries,
        "p50_ms": statistics.median(latencies),
        "p99_ms": _percentile(latencies, 0.99),
        "rss_per_sub_kib": (rss_after - rss_before) / size,
        "rss_mib": rss_after / 1024,
        "server_cpu_ms_per_publish": cpu_per_publish_ms,
    }


async def orchestrate(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"subscribers per client process: {args.per_process}; {args.publishes} publishes "
          f"after 3 warm-up; soft RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}; "
          f"gc thresholds {args.gc_threshold or 'default'}")
    for size in sizes:
        results = {}
        for kind in ("floor", "ours"):
            results[kind] = r = await run_one(kind, size, args.per_process, args.publishes)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in r.items()}), flush=True)
        floor, ours = results["floor"], results["ours"]
        print(
            f"N={size:>6}: publish -> last subscriber  "
            f"p50 {ours['p50_ms']:.1f} ms vs floor {floor['p50_ms']:.1f} ms "
            f"(x{ours['p50_ms'] / floor['p50_ms']:.2f}),  "
            f"p99 {ours['p99_ms']:.1f} ms vs floor {floor['p99_ms']:.1f} ms "
            f"(x{ours['p99_ms'] / floor['p99_ms']:.2f});  "
            f"RSS/subscriber {ours['rss_per_sub_kib']:.1f} KiB vs floor "
            f"{floor['rss_per_sub_kib']:.1f} KiB "
            f"(x{ours['rss_per_sub_kib'] / floor['rss_per_sub_kib']:.2f}); "
            f"server RSS {ours['rss_mib']:.0f} MiB vs {floor['rss_mib']:.0f} MiB; "
            f"server CPU per publish {ours['server_cpu_ms_per_publish']:.0f} ms vs "
            f"{floor['server_cpu_ms_per_publish']:.0f} ms "
            f"(x{ours['server_cpu_ms_per_publish'] / floor['server_cpu_ms_per_publish']:.2f})",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--publishes", type=int, default=50)
    parser.add_argument("--per-process", type=int, default=500)
    parser.add_argument("--gc-threshold", metavar="G0,G1,G2",
                        help="gc.set_threshold in every process (default: Python's 700,10,10)")
    parser.add_argument("--server", choices=("floor", "ours"))
    parser.add_argument("--clients", nargs=2, metavar=("PORT", "COUNT"))
    args = parser.parse_args()
    raise_fd_limit()
    if args.gc_threshold:
        os.environ["BENCH_STREAM_GC_THRESHOLD"] = args.gc_threshold  # inherited by children
    threshold = os.environ.get("BENCH_STREAM_GC_THRESHOLD")
    if threshold:  # every process of the run, floor and ours alike
        import gc

        gc.set_threshold(*(int(x) for x in threshold.split(",")))
    if args.server == "floor":
        trio.run(floor_server)
    elif args.server == "ours":
        trio.run(our_server)
    elif args.clients:
        trio.run(clients, int(args.clients[0]), int(args.clients[1]))
    else:
        trio.run(orchestrate, args)


if __name__ == "__main__":
    main()
