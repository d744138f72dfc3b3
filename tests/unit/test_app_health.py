"""The daemon's liveness rules (``/healthz`` reasons, ``WATCHDOG=1``) for a stuck restart.

A restarted child that hangs before reporting started is down once it has been
``starting`` longer than the start limit (the stall limit, ``stall_limit_s``): ``Daemon.unhealthy()`` names it with
how long, and the watchdog stops pinging, so systemd restarts the process. The
daemon's own tree is replaced by fakes of the tree's seam (start functions);
a sibling finishes a convergence attempt every 0.5 s so the stall rule stays
quiet. Virtual time throughout.
"""

from __future__ import annotations

import random

import trio
import trio.testing

from supervisor.app import Daemon
from supervisor.config import Config, ControlPlaneConfig
from supervisor.health import stall_limit_s, status_line
from supervisor.lifecycle.systemd import Notifier, run_watchdog
from supervisor.tree import ChildSpec, Supervisor

CONTROL_PLANE = ControlPlaneConfig(poll_interval_s=1.0, backoff_max_s=1.0)
LIMIT_S = stall_limit_s(CONTROL_PLANE)
PING_S = 0.5


class Pings(Notifier):
    """A notifier that keeps the time of each WATCHDOG=1 instead of sending it."""

    def __init__(self) -> None:
        super().__init__({})
        self.at: list[float] = []
        self.statuses: list[str] = []

    def send(self, **fields: str) -> bool:
        if fields.get("WATCHDOG") == "1":
            self.at.append(trio.current_time())
        if "STATUS" in fields:
            self.statuses.append(fields["STATUS"])
        return True

    def between(self, start: float, end: float) -> int:
        return sum(1 for t in self.at if start < t <= end)


class HangsOnSecondStart:
    """Starts, crashes after 1 s; its second start never reports started."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(trio.current_time())
        if len(self.starts) == 2:
            await trio.sleep_forever()
        task_status.started()
        await trio.sleep(1.0)
        raise RuntimeError("crash")


def daemon_with(hanger: HangsOnSecondStart) -> Daemon:
    daemon = Daemon(Config(control_plane=CONTROL_PLANE))

    async def attempts(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            daemon.status.attempt_finished()
            await trio.sleep(0.5)

    daemon.tree = Supervisor([ChildSpec("convergence", attempts), ChildSpec("hanger", hanger.run)],
                             intensity=5, period_s=60, rng=random.Random(3))
    return daemon


async def test_a_restart_stuck_starting_is_unhealthy_and_stops_the_watchdog(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hanger = HangsOnSecondStart()
    daemon = daemon_with(hanger)
    assert daemon.tree is not None
    pings = Pings()
    daemon.notifier = pings
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.tree.run)
        daemon._ready = True
        nursery.start_soon(run_watchdog, pings, PING_S, daemon._watchdog_healthy)
        while len(hanger.starts) < 2:
            await trio.sleep(0.01)
        restarted_at = hanger.starts[1]
        # Starting, within the limit: not down (a restart takes a moment).
        await trio.sleep_until(restarted_at + LIMIT_S - 0.1)
        assert daemon.unhealthy() == []
        assert daemon._watchdog_healthy()
        assert pings.between(restarted_at, restarted_at + LIMIT_S - 0.1) >= 7
        # Past it: named with how long, and no more pings.
        await trio.sleep_until(restarted_at + LIMIT_S + 2.5)
        assert daemon.unhealthy() == [
            f"child hanger has been starting for {LIMIT_S + 2.5:.1f} s (limit {LIMIT_S:g} s)"]
        assert not daemon._watchdog_healthy()
        await trio.sleep_until(restarted_at + 100)
        assert pings.between(restarted_at + LIMIT_S + 0.01, restarted_at + 100) == 0
        assert daemon.tree.report()["hanger"].state == "starting"
        # systemctl status says so, once (not at every watchdog interval).
        unhealthy = [line for line in pings.statuses if line.startswith("unhealthy: ")]
        assert len(unhealthy) == 1
        assert unhealthy[0].startswith("unhealthy: child hanger has been starting for ")
        nursery.cancel_scope.cancel()


async def test_a_boot_that_takes_long_is_for_readiness_not_liveness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The first start (the convergence child's is the boot) is never counted."""
    daemon = Daemon(Config(control_plane=CONTROL_PLANE))

    async def boot(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.sleep_forever()

    daemon.tree = Supervisor([ChildSpec("convergence", boot)], intensity=5, period_s=60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(daemon.tree.run)
        await trio.sleep(100 * LIMIT_S)
        assert daemon.tree.children["convergence"].state == "starting"
        assert daemon.unhealthy() == []
        nursery.cancel_scope.cancel()


def test_the_status_line_when_the_watchdog_answer_changes() -> None:
    assert status_line(False, ["child c is backoff: boom", "a stall"], 3) == (
        "unhealthy: child c is backoff: boom; a stall")
    assert status_line(False, [], 3) == "unhealthy: children crash looping"
    assert status_line(True, [], 3) == "healthy again; serving revision 3"
    assert status_line(True, [], None) == "healthy again"
