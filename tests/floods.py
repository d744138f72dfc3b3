"""Hostile and ordinary admin clients on raw sockets, for the flood tests and the bench.

Raw sockets rather than httpx or trio-websocket: thousands of them must be cheap
for the test process, and a hostile client is exactly one that does not behave
like a library would. Every wait is bounded by the caller's ``trio.fail_after``
or by the ``timeout`` given.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[1]
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # length 0, type SETTINGS, stream 0


async def connect(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def read_head(stream: trio.SocketStream) -> bytes:
    """Bytes up to the end of a response head (or EOF)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        data += chunk
    return data


async def request(port: int, path: str, *, host: str = "127.0.0.1",
                  headers: str = "", method: str = "GET") -> tuple[int, bytes, float]:
    """One request (``GET`` unless told) on a new connection: (status, whole response,
    seconds taken)."""
    started = time.monotonic()
    stream = await connect(port)
    if method == "POST":
        headers += "Content-Length: 0\r\n"
    try:
        await stream.send_all(
            f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
            .encode()
        )
        data = b""
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        await stream.aclose()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0
    return status, data, time.monotonic() - started


async def until_closed(stream: trio.SocketStream) -> None:
    """Return when the server closes or resets the connection; data it sends is discarded."""
    try:
        while await stream.receive_some(65536):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def websocket_request(path: str = "/v1/stream", *, host: str = "127.0.0.1",
                      origin: str | None = None) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
    ]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def probe_once(port: int, timeout: float = 2.0) -> float:
    """One blocking ``GET /healthz`` on a new connection; its latency (raises unless 200)."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        raise OSError(f"unexpected answer {data[:40]!r}")
    return time.perf_counter() - started


def _probe_main(port: int, interval_s: float) -> None:
    """Probe until stdin closes, then print ``{"latencies": [...], "failures": [...]}``."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    latencies: list[float] = []
    failures: list[str] = []
    while not stop.is_set():
        try:
            latencies.append(probe_once(port))
        except OSError as exc:
            failures.append(repr(exc))
        stop.wait(interval_s)
    print(json.dumps({"latencies": latencies, "failures": failures}))


class ProbeProcess:
    """:func:`probe_once` every ``interval_s`` in a child process, so that the load
    of the test's own event loop (the flood) does not count in the latencies."""

    def __init__(self, port: int, interval_s: float = 0.05) -> None:
        self.port, self.interval_s = port, interval_s
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> ProbeProcess:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.floods", "probe", str(self.port), str(self.interval_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        )
        return self

    def stop(self) -> None:
        """Ends the probing and collects the figures (blocking: call it from a thread)."""
        assert self._process is not None
        out, _ = self._process.communicate("", timeout=10)
        doc = json.loads(out)
        self.latencies, self.failures = doc["latencies"], doc["failures"]

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "probe":
        _probe_main(int(sys.argv[2]), float(sys.argv[3]))
    else:
        sys.exit("usage: python -m tests.floods probe PORT INTERVAL_S")
