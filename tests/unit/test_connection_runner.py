"""The connection runner replaces a connection the server closed while idle, within the call."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio

from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.controlplane.runner import ConnectionRunner, StaleConnection


class _Closed(Exception):
    """The driver's own error: the server closed the connection."""


class _Driver:
    errors: tuple[type[BaseException], ...] = (_Closed,)

    def __init__(self, stale: set[int]) -> None:
        self.stale = stale  # connection numbers whose first round trip finds them closed
        self.opened = 0
        self.closed: list[int] = []
        self.calls: list[int] = []

    def open(self, stop: threading.Event) -> int:
        self.opened += 1
        return self.opened

    def setup(self, conn: int) -> None:
        pass

    def received(self) -> int | None:
        return None

    def call(self, conn: int, fn: Callable[[int], Any], stop: threading.Event) -> Any:
        self.calls.append(conn)
        if conn in self.stale:
            raise StaleConnection("closed") from _Closed("terminating connection due to "
                                                        "idle-session timeout")
        return fn(conn)

    def interrupt(self, conn: int, stop: threading.Event) -> None:
        pass

    def close(self, conn: int) -> None:
        self.closed.append(conn)

    def map_error(self, exc: BaseException, what: str) -> ControlPlaneError:
        return ControlPlaneError(f"control plane {what} failed: {exc}",
                                 category=FailureCategory.UNAVAILABLE)

    def keeps(self, conn: int, error: ControlPlaneError) -> bool:
        return False


async def test_a_kept_connection_closed_while_idle_is_replaced_within_the_call() -> None:
    driver = _Driver(stale={1})
    runner: ConnectionRunner[int] = ConnectionRunner(driver, deadline_s=10)
    with trio.fail_after(10):
        # The first call opens connection 1 and finds it fine only because it is new.
        driver.stale = set()
        assert await runner.run("read", lambda conn: conn) == 1
        # The server closes it while idle: the next call runs on connection 2.
        driver.stale = {1}
        assert await runner.run("read", lambda conn: conn * 10) == 20
    # Each new connection's first call is its setup.
    assert driver.calls == [1, 1, 1, 2, 2] and driver.closed == [1] and driver.opened == 2


async def test_a_new_connection_found_closed_at_once_is_an_outage() -> None:
    driver = _Driver(stale={1, 2})
    runner: ConnectionRunner[int] = ConnectionRunner(driver, deadline_s=10)
    with trio.fail_after(10):
        with pytest.raises(ControlPlaneError) as info:
            await runner.run("read", lambda conn: conn)
    assert info.value.category is FailureCategory.UNAVAILABLE
    assert "idle-session timeout" in str(info.value)
    # Only a kept connection is retried: a fresh one failing is reported at once.
    assert driver.calls == [1] and driver.closed == [1]
