"""Helpers of the chaos suite: configuration, plain-SQL publishing, stream clients, fakes.

Everything here drives the real daemon process (:mod:`tests.proc`) against the
real PostgreSQL server (``pg_url``) and, for Kubernetes, the fake API server run
as its own process. Waits are on events (log lines, stream messages, process
exit, a line on a pipe); the only polls are bounded loops over external state
(``pg_stat_activity``, the fake API server's objects) with a short sleep.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from tests.health import metric_sum
from tests.polling import poll_until as _poll_until
from tests.proc import REPO, Daemon, free_port, write_config

# -- configuration ------------------------------------------------------------------


def chaos_config(
    directory: Path,
    url: str,
    *,
    port: int | None = None,
    poll_interval_s: float = 1.0,
    listen: bool = True,
    backoff_initial_s: float = 0.05,
    backoff_max_s: float = 0.5,
    grace_s: float = 5.0,
    extra: str = "",
) -> tuple[Path, int]:
    """Write a configuration for the daemon; returns (path, admin port)."""
    port = port or free_port()
    path = write_config(directory, url, extra, port=port, grace_s=grace_s,
                        poll_interval_s=poll_interval_s, listen=listen,
                        backoff_initial_s=backoff_initial_s, backoff_max_s=backoff_max_s)
    return path, port


# -- revisions ------------------------------------------------------------------------


def revision_body(aliases: int, tag: str) -> bytes:
    """A schema-1 revision with ``aliases`` aliases, each upstream carrying ``tag``.

    The tag makes every revision's content distinct, so a snapshot can be matched
    to exactly the revision it was compiled from.
    """
    doc = {
        "schema_version": 1,
        "aliases": {
            f"a{i:05d}": {"upstream": f"https://svc-{i}.{tag}.example/v1", "timeout_s": 30,
                          "retries": 2}
            for i in range(aliases)
        },
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def tag_of(snapshot: dict[str, Any]) -> set[str]:
    """The tags found in a snapshot's aliases (one, for a snapshot of one revision)."""
    return {alias["upstream"].split(".")[1] for alias in snapshot["aliases"].values()}


def sql_publish(conn: psycopg.Connection[Any], body: bytes) -> int:
    """Publish with plain SQL (anyone may: docs/control-plane.md) in one transaction; returns the id."""
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)"
            " VALUES (1, %s, %s, 'chaos') RETURNING id",
            (body, hashlib.sha256(body).digest()),
        ).fetchone()
        assert row is not None
        rid = int(row[0])
        conn.execute(
            "INSERT INTO supervisor_desired (singleton, revision_id, updated_at)"
            " VALUES (true, %s, now()) ON CONFLICT (singleton) DO UPDATE"
            " SET revision_id = excluded.revision_id, updated_at = now()", (rid,))
    return rid


def publish_once(pg_url: str, body: bytes) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return sql_publish(conn, body)


def daemon_backends(pg_url: str, *, waiting_on_lock: bool = False) -> list[int]:
    """Backend pids of the daemon's connections to this database."""
    query = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
             " AND application_name = 'trio-supervisor' AND pid <> pg_backend_pid()")
    if waiting_on_lock:
        query += " AND wait_event_type = 'Lock'"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return [int(row[0]) for row in conn.execute(query).fetchall()]


async def wait_backend_on_lock(pg_url: str) -> None:
    """Bounded poll (the caller's fail_after) until a daemon query waits on a lock."""

    async def blocked() -> bool:
        return bool(await trio.to_thread.run_sync(
            lambda: daemon_backends(pg_url, waiting_on_lock=True)))

    await _poll_until(blocked)


# -- the process --------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


async def stop_within_grace(daemon: Daemon, grace_s: float) -> float:
    """SIGTERM; assert exit 0 within ``grace_s``; return how long it took."""
    start = trio.current_time()
    daemon.signal(signal.SIGTERM)
    with trio.move_on_after(grace_s + 3):
        code = await daemon.wait()
    took = trio.current_time() - start
    assert daemon.process.returncode is not None, f"still running {took:.1f} s after SIGTERM"
    assert code == 0, f"exit {code} after SIGTERM\n" + "\n".join(daemon.raw[-30:])
    print(f"SIGTERM to exit: {took:.3f} s")
    assert took < grace_s, f"took {took:.2f} s to stop, grace is {grace_s} s"
    return took


def count_lines(daemon: Daemon, event: str, **fields: Any) -> int:
    return sum(1 for line in daemon.lines if line.get("event") == event
               and all(line.get(k) == v for k, v in fields.items()))


async def wait_count(daemon: Daemon, event: str, n: int, **fields: Any) -> None:
    """Wait for the ``n``-th log line ``event`` (with ``fields``); an event, not a poll."""
    while count_lines(daemon, event, **fields) < n:
        if daemon.process.returncode is not None:
            raise AssertionError(f"process exited before {n} x {event!r}:\n"
                                 + "\n".join(daemon.raw[-30:]))
        await daemon._new_line.wait()


async def wait_fields(daemon: Daemon, **fields: Any) -> dict[str, Any]:
    """Wait for a log line carrying ``fields`` whatever its event text."""
    seen = 0
    while True:
        for line in daemon.lines[seen:]:
            if all(line.get(k) == v for k, v in fields.items()):
                return dict(line)
        seen = len(daemon.lines)
        if daemon.process.returncode is not None:
            raise AssertionError(f"process exited before a line with {fields}")
        await daemon._new_line.wait()


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from a Prometheus text exposition; no such sample fails."""
    value = metric_sum(text, name, **labels)
    if value is None:
        raise AssertionError(f"no sample {name} {labels}")
    return value


# -- stream clients -----------------------------------------------------------------


@dataclass
class StreamClient:
    """One WebSocket client of /v1/stream that records every message it reads."""

    url: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    close_code: int | None = None
    connected: trio.Event = field(default_factory=trio.Event)
    closed: trio.Event = field(default_factory=trio.Event)
    _changed: trio.Event = field(default_factory=trio.Event)

    @property
    def latest(self) -> int | None:
        return self.published[-1] if self.published else None

    async def run(self) -> None:
        try:
            async with open_websocket_url(self.url) as ws:
                while True:
                    try:
                        message = json.loads(await ws.get_message())
                    except ConnectionClosed as exc:
                        self.close_code = exc.reason.code
                        return
                    self.messages.append(message)
                    if message.get("type") == "status" and not self.connected.is_set():
                        self.connected.set()
                    elif message.get("type") == "published":
                        self.published.append(int(message["revision"]))
                    self._changed.set()
                    self._changed = trio.Event()
        except ConnectionClosed as exc:
            self.close_code = exc.reason.code
        finally:
            self.closed.set()
            self._changed.set()

    async def wait_published(self, revision: int) -> None:
        while not self.published or max(self.published) < revision:
            if self.closed.is_set():
                raise AssertionError(f"stream closed ({self.close_code}) before revision "
                                     f"{revision}; saw up to {self.latest}")
            await self._changed.wait()


@asynccontextmanager
async def stream_clients(port: int, n: int) -> AsyncIterator[list[StreamClient]]:
    """``n`` connected clients (each has read the first status message)."""
    clients = [StreamClient(f"ws://127.0.0.1:{port}/v1/stream") for _ in range(n)]
    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(client.run)
        for client in clients:
            await client.connected.wait()
        yield clients
        nursery.cancel_scope.cancel()


async def get_json(client: httpx.AsyncClient, url: str) -> tuple[int, dict[str, Any], str | None]:
    resp = await client.get(url)
    return resp.status_code, resp.json(), resp.headers.get("etag")


# -- the fake Kubernetes API server as a process ---------------------------------------


@dataclass
class FakeApiServerProcess:
    process: trio.Process
    url: str
    token: str | None = None  # write_kubeconfig reads it

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(5):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()


@asynccontextmanager
async def fake_apiserver_process(log_path: Path, *, port: int = 0,
                                 bookmark_interval_s: float = 0.5,
                                 ) -> AsyncIterator[FakeApiServerProcess]:
    """``python -m tests.fakes.apiserver`` as its own process; its URL read from stdout."""
    with open(log_path, "ab") as log:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tests.fakes.apiserver", "--port", str(port),
             "--bookmark-interval", str(bookmark_interval_s)],
            stdout=subprocess.PIPE, stderr=log, cwd=str(REPO),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    server = FakeApiServerProcess(process, "")
    try:
        assert process.stdout is not None
        buffer = b""
        with trio.fail_after(20):
            while b"\n" not in buffer:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    raise AssertionError(f"fake API server exited: {log_path.read_text()}")
                buffer += chunk
        server.url = buffer.split(b"\n", 1)[0].decode().strip()
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await server.stop()


async def snapshot_file_at(path: Path, revision: int) -> dict[str, Any]:
    """The snapshot file once it holds ``revision`` (it is written after the publish event)."""

    async def read() -> dict[str, Any] | None:
        data = json.loads(await trio.to_thread.run_sync(path.read_bytes))
        return dict(data) if data["revision"] == revision else None

    return dict(await poll_until(read, f"snapshot file at revision {revision}", 10))


async def poll_until(predicate: Callable[[], Awaitable[Any]], what: str,
                     timeout_s: float = 30.0) -> Any:
    """Poll external state until ``predicate()`` is truthy (bounded); returns that value."""
    found: list[Any] = []

    async def holds() -> bool:
        value = await predicate()
        if value:
            found.append(value)
        return bool(value)

    with trio.move_on_after(timeout_s):
        await _poll_until(holds)
        return found[0]
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def body(n: int) -> bytes:
    return json.dumps({"schema_version": 1, "aliases": {
        f"r{n}": {"upstream": f"https://r{n}.example/v1"}}}).encode()


def publish(db: Path, n: int) -> int:
    data = body(n)
    with sqlite3.connect(db) as conn:
        cur = conn.execute(
            "INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)"
            " VALUES (1, ?, ?, 'round')", (data, hashlib.sha256(data).digest()))
        rid = cur.lastrowid
        conn.execute("INSERT INTO supervisor_desired (singleton, revision_id) VALUES (1, ?)"
                     " ON CONFLICT (singleton) DO UPDATE SET revision_id = excluded.revision_id",
                     (rid,))
    assert rid is not None
    return rid


def shown(snapshot: Path) -> int | None:
    try:
        return int(json.loads(snapshot.read_bytes())["revision"])
    except (OSError, ValueError):
        return None


def move_control_plane(src: Path, dst: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        path = src.with_name(src.name + suffix)
        if path.exists():
            path.rename(dst.with_name(dst.name + suffix))
