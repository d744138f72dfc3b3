"""Run the real daemon process in tests: config files, the notify socket, log lines.

Every wait here is for an event (a datagram, a log line, process exit) under a
``trio.fail_after`` guard; nothing sleeps to wait for something.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[1]
#: Names the directory of a crash drill's fault files (tests/faultdaemon.py).
FAULT_DIR_ENV = "SUPERVISOR_TEST_FAULT_DIR"
EXAMPLE = REPO / "conf" / "example-revision.toml"


def _ports() -> Iterator[int]:
    # Below the kernel's ephemeral range (32768 and up by default), so no outgoing
    # connection takes a port between free_port() and the daemon's bind; each xdist
    # worker a block of its own, walked from a random start, so two runs side by side
    # rarely meet.
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    first = _PORTS_FROM + (worker % _BLOCKS) * _BLOCK
    start = random.randrange(_BLOCK)
    return (first + (start + n) % _BLOCK for n in itertools.count())


_PORTS_FROM, _BLOCK, _BLOCKS = 20000, 1500, 8
_next_port = _ports()


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on, for a server the test starts next.

    Never handed out twice by one worker within 1,500 calls, and never one the kernel
    gives an outgoing connection (the race of binding port 0 and closing it). Once
    round the block finding none free is an error.
    """
    for port in itertools.islice(_next_port, _BLOCK):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port in this worker's block of {_BLOCK}")


def write_config(directory: Path, url: str, extra: str = "", *, port: int | None = None,
                 grace_s: float = 5.0, poll_interval_s: float = 1.0,
                 listen: bool | None = None, backoff_initial_s: float | None = None,
                 backoff_max_s: float | None = None,
                 control_plane_extra: str = "") -> Path:
    """The daemon's configuration for a test; ``extra`` lands in ``[admin]`` or after it.

    ``control_plane_extra`` lands in ``[control_plane]`` (follower mode's
    trusted_keys, fetch bounds).
    """
    port = port or free_port()
    control_plane = [f'url = "{url}"', f"poll_interval_s = {poll_interval_s}"]
    if control_plane_extra:
        control_plane.append(control_plane_extra)
    if listen is not None:
        control_plane.append(f"listen = {'true' if listen else 'false'}")
    if backoff_initial_s is not None:
        control_plane.append(f"backoff_initial_s = {backoff_initial_s}")
    if backoff_max_s is not None:
        control_plane.append(f"backoff_max_s = {backoff_max_s}")
    path = directory / "supervisor.toml"
    newline = "\n"
    path.write_text(
        f"""
[supervisor]
shutdown_grace_s = {grace_s}
[log]
level = "info"
format = "json"
[control_plane]
{newline.join(control_plane)}
[admin]
listen = "127.0.0.1:{port}"
{extra}
"""
    )
    return path


def cli(*args: str, env: Mapping[str, str] | None = None, check: bool = True,
        timeout: float = 60, cwd: Path = REPO, stdin: Any = None,
        address_space: int | None = None,
        close_stdin: bool = False) -> subprocess.CompletedProcess[str]:
    """The command line, run to its end; ``stdin`` its standard input (a file, a str),
    ``address_space`` its RLIMIT_AS in bytes (a read past it fails: memory is bounded);
    ``close_stdin``: started with no standard input at all (``<&-``)."""
    full_env = {**os.environ, **(env or {})}

    def limit_address_space() -> None:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        if close_stdin:
            os.close(0)

    result = subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout, check=False,
        input=stdin if isinstance(stdin, str) else None,
        stdin=None if isinstance(stdin, str) else stdin,
        preexec_fn=limit_address_space if address_space is not None or close_stdin else None,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{args} exited {result.returncode}\nstdout:{result.stdout}\nstderr:{result.stderr}"
        )
    return result


class NotifySocket:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.messages: list[tuple[float, str]] = []

    async def bind(self) -> None:
        await self.sock.bind(str(self.path))

    async def receive(self) -> str:
        data = await self.sock.recv(65536)
        text = data.decode()
        self.messages.append((trio.current_time(), text))
        return text

    async def wait_for(self, needle: str) -> str:
        while True:
            text = await self.receive()
            if needle in text:
                return text

    def close(self) -> None:
        self.sock.close()


@dataclass
class Daemon:
    process: trio.Process
    lines: list[dict[str, Any]] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    _new_line: trio.Event = field(default_factory=trio.Event)

    async def _pump(self) -> None:
        assert self.process.stderr is not None
        buffer = b""
        async for chunk in self.process.stderr:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                text = line.decode(errors="replace")
                self.raw.append(text)
                try:
                    self.lines.append(json.loads(text))
                except ValueError:
                    self.lines.append({"event": text, "unparsed": True})
            self._new_line.set()
            self._new_line = trio.Event()
        # End of output: a waiter for a line that never came learns of the exit
        # now instead of at its own deadline.
        await self.process.wait()
        self._new_line.set()

    async def wait_log(self, event: str | None, **fields: Any) -> dict[str, Any]:
        """The first log line with this ``event`` (any, when None) and these fields."""
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if (event is None or line.get("event") == event) and all(
                    line.get(k) == v for k, v in fields.items()
                ):
                    return line
            seen = len(self.lines)
            if self.process.returncode is not None:
                raise AssertionError(f"process exited before logging {event!r}:\n"
                                     + "\n".join(self.raw))
            await self._new_line.wait()

    async def wait_logs(self, event: str, count: int, **fields: Any) -> list[dict[str, Any]]:
        """The first ``count`` log lines with this ``event`` and these fields."""
        while True:
            found = [line for line in self.lines if line.get("event") == event
                     and all(line.get(k) == v for k, v in fields.items())]
            if len(found) >= count:
                return found[:count]
            if self.process.returncode is not None:
                raise AssertionError(f"process exited before logging {event!r} {count} times:\n"
                                     + "\n".join(self.raw))
            await self._new_line.wait()

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    async def wait(self) -> int:
        return await self.process.wait()


@asynccontextmanager
async def run_daemon(config: Path, *, env: Mapping[str, str] | None = None,
                     args: tuple[str, ...] = (), nofile: int | None = None,
                     cwd: Path | None = None) -> AsyncIterator[Daemon]:
    """The daemon on ``config``; ``nofile`` lowers its RLIMIT_NOFILE (soft and hard).

    ``cwd`` (default: the repository) is where relative paths in ``config`` start.
    """
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    # A fault directory means a crash drill: the real daemon with its children behind
    # fault switches the test flips (tests/faultdaemon.py).
    module = "tests.faultdaemon" if FAULT_DIR_ENV in full_env else "supervisor"

    def lower_nofile() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", module, *args, "--config", str(config)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=full_env, cwd=str(cwd or REPO),
        preexec_fn=lower_nofile if nofile is not None else None,
    )
    daemon = Daemon(process)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(daemon._pump)
        try:
            yield daemon
        finally:
            if process.returncode is None:
                process.kill()
            with trio.move_on_after(10, shield=True):
                await process.wait()
            nursery.cancel_scope.cancel()


async def acli(*args: str, env: Mapping[str, str] | None = None, check: bool = True,
               timeout: float = 60, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """:func:`cli` in a worker thread, so the test's own servers (a proxy) keep running."""
    return await trio.to_thread.run_sync(
        lambda: cli(*args, env=env, check=check, timeout=timeout, cwd=cwd)
    )
