"""The sd_notify implementation against a datagram socket the test binds."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import trio
import trio.testing

from supervisor.lifecycle.systemd import Notifier, run_watchdog, watchdog_interval


def bind(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    return sock


def drain(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_messages_reach_a_path_socket(tmp_path: Path) -> None:
    sock = bind(tmp_path / "notify")
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify")})
    notifier.ready("serving revision 3")
    notifier.status("serving revision 3")  # unchanged: not sent again
    notifier.status("serving revision 4")
    notifier.stopping()
    assert drain(sock) == [
        "READY=1\nSTATUS=serving revision 3",
        "STATUS=serving revision 4",
        "STOPPING=1\nSTATUS=stopping",
    ]


def test_abstract_socket() -> None:
    name = f"tsup-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.setblocking(False)
    assert Notifier({"NOTIFY_SOCKET": "@" + name}).send(READY="1")
    assert drain(sock) == ["READY=1"]


def test_without_socket_is_a_noop_and_a_dead_socket_never_raises(tmp_path: Path) -> None:
    assert Notifier({}).address is None
    assert Notifier({}).send(READY="1") is False
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert gone.send(READY="1") is False


def test_watchdog_interval() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "2000000"}) == 1.0
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}) == 1.0


async def test_watchdog_pings_only_while_healthy(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sock = bind(tmp_path / "notify")
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify")})
    healthy = True
    with trio.move_on_after(10.5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_watchdog, notifier, 1.0, lambda: healthy)
            await trio.sleep(5.5)
            healthy = False
    assert drain(sock) == ["WATCHDOG=1"] * 6
