"""A restarted child that hangs before reporting started is stuck, not healthy.

The tree records when each child entered its state (``ChildState.since``) and
names the restarted children still ``starting`` past a limit
(``Supervisor.stuck_starting``). A first start is never counted: it is the
caller's start-up, which readiness covers. Virtual time throughout.
"""

from __future__ import annotations

import random

import trio
import trio.testing

from supervisor.tree import ChildSpec, Supervisor
from tests.fakes.children import FaultSwitch

LIMIT_S = 10.0


class HangsOnSecondStart:
    """Starts, crashes after ``crash_after_s``; its second start never reports started."""

    def __init__(self, crash_after_s: float = 1.0) -> None:
        self.crash_after_s = crash_after_s
        self.starts: list[float] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(trio.current_time())
        if len(self.starts) == 2:
            await trio.sleep_forever()  # stuck on something, before started
        task_status.started()
        await trio.sleep(self.crash_after_s)
        raise RuntimeError("crash")


async def forever(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    await trio.sleep_forever()


def make(specs: list[ChildSpec]) -> Supervisor:
    return Supervisor(specs, intensity=5, period_s=60, rng=random.Random(3))


async def test_a_restart_hanging_before_started_is_stuck_once_past_the_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hanger = HangsOnSecondStart()
    tree = make([ChildSpec("steady", forever), ChildSpec("hanger", hanger.run)])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(1.1)  # past the crash (at 1.0)
        child = tree.children["hanger"]
        assert child.state == "backoff"
        assert child.since == hanger.starts[0] + 1.0  # entered at the crash
        while len(hanger.starts) < 2:
            await trio.sleep(0.01)
        restarted_at = hanger.starts[1]
        assert child.state == "starting"
        assert child.since == restarted_at
        await trio.sleep_until(restarted_at + LIMIT_S)
        assert tree.stuck_starting(LIMIT_S) == {}  # not past the limit yet
        await trio.sleep_until(restarted_at + LIMIT_S + 2.5)
        assert tree.stuck_starting(LIMIT_S) == {"hanger": LIMIT_S + 2.5}
        assert tree.report()["hanger"].state == "starting"
        nursery.cancel_scope.cancel()


async def test_a_first_start_that_hangs_is_the_boot_and_never_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def boot(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.sleep_forever()

    tree = make([ChildSpec("steady", forever), ChildSpec("boot", boot)])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tree.run)
        await trio.sleep(1000 * LIMIT_S)
        assert tree.children["boot"].state == "starting"
        assert tree.stuck_starting(LIMIT_S) == {}
        nursery.cancel_scope.cancel()


async def test_a_hung_restart_is_stuck_until_a_crash_ends_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts: list[float] = []

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started()
        await trio.sleep_forever()

    switch = FaultSwitch("c", child)
    tree = make([ChildSpec("c", switch)])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(1)
        assert switch.crash(hang_next_start=True) is True
        await trio.sleep(LIMIT_S + 5)
        # Crashed and restarted, but the restart never reached the child's start.
        assert len(starts) == 1
        assert tree.report()["c"].restarts == 1
        assert "c" in tree.stuck_starting(LIMIT_S)
        # A plain crash ends the hang; the next start is a real one.
        assert switch.crash() is True
        await trio.sleep(5)
        assert len(starts) == 2
        assert tree.report()["c"].state == "running"
        assert tree.stuck_starting(LIMIT_S) == {}
        nursery.cancel_scope.cancel()


class TimesOutWhileStarting:
    """Starts once, crashes; every later start hangs ``hang_s`` and then fails (a timeout).

    A start stuck on something usually has a timeout: it hangs, crashes, waits
    its backoff and hangs again. Each attempt alone stays under the limit.
    """

    def __init__(self, hang_s: float) -> None:
        self.hang_s = hang_s
        self.starts = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts += 1
        if self.starts > 1:
            await trio.sleep(self.hang_s)
            raise TimeoutError("start timed out")
        task_status.started()
        await trio.sleep(1.0)
        raise RuntimeError("crash")


async def test_restarts_that_each_hang_under_the_limit_and_time_out_are_stuck(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Time spent starting adds up across failed restarts until the child runs again.

    Each start hangs 0.8 of the limit and fails; restarts are spaced wider than
    the restart period, so the intensity never gives up and the child is never
    crash looping. Counting only the current attempt, it was never stuck,
    though it has not run since its first crash.
    """
    timeout = TimesOutWhileStarting(hang_s=0.8 * LIMIT_S)
    tree = Supervisor([ChildSpec("steady", forever), ChildSpec("c", timeout.run)],
                      intensity=5, period_s=5.0, rng=random.Random(3))
    seen: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        for _ in range(int(3 * LIMIT_S / 0.1)):
            await trio.sleep(0.1)
            assert not tree.crash_looping
            seen.update(tree.stuck_starting(LIMIT_S))
        assert timeout.starts >= 3
        assert tree.children["c"].state in ("starting", "backoff")
        nursery.cancel_scope.cancel()
    assert "c" in seen


async def test_time_starting_is_forgotten_once_the_child_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Time starting adds up only until the child runs again.

    Every other restart hangs 0.7 of the limit and fails; the ones between come
    up and run a moment. Counted since the child last ran, no attempt is past
    the limit; added up across runs, the second hang would be.
    """
    starts: list[float] = []

    async def alternating(
        *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        starts.append(trio.current_time())
        if len(starts) % 2 == 0:
            await trio.sleep(0.7 * LIMIT_S)
            raise RuntimeError("timed out while starting")
        task_status.started()
        await trio.sleep(1.0)
        raise RuntimeError("crash")

    tree = Supervisor([ChildSpec("c", alternating)], intensity=50, period_s=1.0,
                      rng=random.Random(3))
    seen: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        while len(starts) < 6:
            await trio.sleep(0.1)
            seen.update(tree.stuck_starting(LIMIT_S))
        nursery.cancel_scope.cancel()
    assert seen == {}
