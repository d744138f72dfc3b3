"""A NOTIFY storm wakes the convergence loop at most once per notify_min_interval_s.

Anyone who may connect may ``NOTIFY`` the channel (no table privilege needed):
a loop of ``pg_notify`` once made thousands of convergence attempts. The
listener's serve loop runs here on virtual time against a fake connection whose
socket (one end of a socket pair) becomes readable for each notification.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import structlog
import trio
import trio.testing

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane import listen
from supervisor.telemetry import Metrics
from supervisor.wakeup import Wakeup


class NotifyingConn:
    """What ``_serve`` uses of a psycopg connection; ``send`` is one NOTIFY arriving."""

    closed = False

    def __init__(self) -> None:
        self.ours, self.server = socket.socketpair()
        self.ours.setblocking(False)

    def send(self) -> None:
        self.server.send(b"n")

    def fileno(self) -> int:
        return self.ours.fileno()

    def notifies(self, timeout: float = 0) -> Iterator[Any]:
        try:
            pending = self.ours.recv(1 << 16)
        except BlockingIOError:
            pending = b""
        for _ in pending:
            yield SimpleNamespace(channel="supervisor_desired", payload="1")

    def execute(self, _query: str) -> None:  # the probe
        return None


def listener(wakes: list[float], min_interval_s: float, metrics: Metrics) -> Any:
    config = ControlPlaneConfig(url="postgresql://postgres@127.0.0.1:1/x",
                                notify_min_interval_s=min_interval_s)
    return listen._Listener(config, lambda _why: wakes.append(trio.current_time()), metrics,
                            30.0, Wakeup())


async def storm(conn: NotifyingConn, for_s: float, every_s: float) -> None:
    for _ in range(round(for_s / every_s)):
        conn.send()
        await trio.sleep(every_s)


async def test_a_storm_wakes_the_loop_at_most_once_per_interval_and_is_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wakes: list[float] = []
    metrics = Metrics(process=False)
    serving = listener(wakes, 0.05, metrics)
    conn = NotifyingConn()
    with trio.fail_after(600), structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serving._serve, conn)
            start = trio.current_time()
            await storm(conn, 2.0, 0.001)  # 2,000 notifications in 2 s
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    assert metrics.listen_notifications._value.get() == 2000
    # One at the first notification, one per interval after it, and the last one held.
    assert 2.0 / 0.05 - 2 <= len(wakes) <= 2.0 / 0.05 + 2, len(wakes)
    gaps = [b - a for a, b in itertools.pairwise(wakes)]
    assert min(gaps) >= 0.05 - 1e-9
    assert wakes[-1] - start >= 2.0 - 0.05  # the last notification was not lost
    assert metrics.listen_wakeups_held._value.get() >= len(wakes) - 2
    assert [e["event"] for e in logs if "storm" in e["event"]] == ["notification storm began"]


async def test_a_storm_is_logged_once_a_minute_and_its_end_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wakes: list[float] = []
    serving = listener(wakes, 0.05, Metrics(process=False))
    conn = NotifyingConn()
    with trio.fail_after(600), structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serving._serve, conn)
            await storm(conn, 150.0, 0.01)
            await trio.sleep(5.0)
            conn.send()  # a lone notification after the storm: woken at once
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    said = [(e["event"], e["log_level"]) for e in logs if "storm" in e["event"]]
    assert said == [("notification storm began", "warning"),
                    ("notification storm goes on", "warning"),
                    ("notification storm goes on", "warning"),
                    ("notification storm ended", "info")], said
    assert len(wakes) <= 150.0 / 0.05 + 3  # the storm's (as above) and the lone one


async def test_notifications_slower_than_the_floor_each_wake_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wakes: list[float] = []
    metrics = Metrics(process=False)
    serving = listener(wakes, 0.05, metrics)
    conn = NotifyingConn()
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serving._serve, conn)
            sent = []
            for _ in range(5):
                sent.append(trio.current_time())
                conn.send()
                await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
    assert wakes == sent
    assert metrics.listen_wakeups_held._value.get() == 0
