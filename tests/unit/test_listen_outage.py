"""The LISTEN child's outage lines over a two-minute outage, on virtual time.

The listener's own connect and serve are replaced by fakes of that seam (no
server, no threads), so trio's MockClock drives its backoff: the outage is
told as its first failure, then at most one line a minute with the count, and
one info line when it ends; a poke from the convergence loop ends the backoff
sleep at once, also when it came during the connect attempt before that sleep.
"""

from __future__ import annotations

from typing import Any

import structlog
import trio
import trio.testing

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane import listen
from supervisor.telemetry import Metrics
from supervisor.wakeup import Wakeup


class FakeConn:
    closed = False

    def close(self) -> None:
        self.closed = True


CONFIG = ControlPlaneConfig(url="postgresql://postgres@127.0.0.1:1/x",
                            backoff_initial_s=0.25, backoff_max_s=30.0)


class ScriptedListener(listen._Listener):
    """Connect fails while ``down``; a connection, once made, stays up."""

    def __init__(self, poke: Wakeup) -> None:
        super().__init__(CONFIG, lambda _trigger: None, Metrics(process=False), 30.0, poke)
        self.down = True
        self.connects: list[float] = []
        self.attempts: list[float] = []

    async def _connect(self) -> Any:
        self.attempts.append(trio.current_time())
        await trio.sleep(0.01)  # a refused connect still takes a moment
        if self.down:
            raise OSError("connection refused")
        self.connects.append(trio.current_time())
        return FakeConn()

    async def _serve(self, conn: Any) -> None:
        try:
            await trio.sleep_forever()
        finally:
            conn.closed = True  # no socket to notify about on the way out


async def test_two_minute_listen_outage_logs_start_progress_and_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    poke = Wakeup()
    listener = ScriptedListener(poke)
    with trio.fail_after(600), structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.run)
            await trio.sleep(120)
            listener.down = False
            back = trio.current_time()
            poke.wake()  # the convergence loop's attempt succeeded
            while not listener.connects:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert listener.connects[0] - back < 1.0, "LISTEN waited out its backoff after the poke"
    lines = [e for e in logs if e["event"].startswith("LISTEN connection")]
    events = [e["event"] for e in lines]
    assert events[0] == "LISTEN connection unreachable"
    assert events.count("LISTEN connection unreachable") == 1
    assert 1 <= events.count("LISTEN connection still unreachable") <= 2, events
    assert events[-1] == "LISTEN connection reachable again"
    assert len(events) <= 4, events  # not one line per attempt
    end = lines[-1]
    assert end["log_level"] == "info"
    assert end["after_s"] >= 120 and end["attempts"] >= 5
    progress = [e for e in lines if e["event"] == "LISTEN connection still unreachable"]
    assert all(e["attempts"] >= 2 and e["for_s"] >= 60 for e in progress)


async def test_a_poke_during_a_connect_attempt_ends_the_backoff_after_it_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    poke = Wakeup()
    poke.wake()  # before this listener existed: a fresh listener connects at once anyway
    listener = ScriptedListener(poke)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.run)
            await trio.sleep(0.005)  # the first connect attempt is under way
            poke.wake()
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    first, second, third = listener.attempts[:3]
    assert (first, second) == (0.0, 0.01)  # the poke ended the backoff at once
    # Answered once: the next backoff (reset by the poke, 0.125 s to 0.25 s) runs out.
    assert 0.02 + 0.125 <= third <= 0.02 + 0.25
