"""The supervision tree under virtual time: restarts, backoff, intensity, restart types."""

from __future__ import annotations

import itertools
import random

import msgspec
import pytest
import trio
import trio.testing

from supervisor.errors import BootRefused, SupervisionGaveUp
from supervisor.tree import BACKOFF_INITIAL_S, ChildSpec, Restart, Supervisor
from tests.fakes.children import Crasher


class Steady:
    def __init__(self) -> None:
        self.ticks = 0
        self.starts = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts += 1
        task_status.started()
        while True:
            await trio.sleep(1)
            self.ticks += 1


def make(specs: list[ChildSpec], intensity: int = 5, period_s: float = 60) -> Supervisor:
    return Supervisor(specs, intensity=intensity, period_s=period_s, rng=random.Random(7))


async def test_crashing_child_restarts_with_growing_delays_while_sibling_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    crasher, steady = Crasher(after_s=1.0, crashes=4), Steady()
    tree = make([ChildSpec("steady", steady.run), ChildSpec("crasher", crasher.run)])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(200)
        nursery.cancel_scope.cancel()
    assert len(crasher.starts) == 5
    gaps = [b - a - crasher.after_s for a, b in itertools.pairwise(crasher.starts)]
    # Exponential: each delay at least ~1.33x the previous (2x nominal, jitter 0.8..1.2).
    assert gaps[0] >= BACKOFF_INITIAL_S * 0.8
    for earlier, later in itertools.pairwise(gaps):
        assert later > earlier * 1.3
    # The sibling never restarted and kept ticking the whole time.
    assert steady.starts == 1
    assert steady.ticks >= 199
    report = tree.report()
    assert report["crasher"].restarts == 4
    assert report["crasher"].state == "running"
    assert "crash #4" in report["crasher"].last_error
    assert msgspec.to_builtins(report["steady"]) == {"state": "running", "restarts": 0, "last_error": None}


async def test_intensity_exceeded_gives_up(autojump_clock: trio.testing.MockClock) -> None:
    crasher = Crasher(after_s=0.1)
    tree = make([ChildSpec("crasher", crasher.run)], intensity=3, period_s=60)
    with pytest.raises(BaseException) as info:  # noqa: PT011 - may arrive in an ExceptionGroup
        async with trio.open_nursery() as nursery:
            await nursery.start(tree.run)
    exc = info.value
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, SupervisionGaveUp)
    assert exc.child == "crasher"
    assert len(crasher.starts) == 4  # the first run + 3 restarts; the 4th crash gives up
    assert tree.report()["crasher"].state == "failed"


async def test_restarts_outside_the_period_do_not_count(autojump_clock: trio.testing.MockClock) -> None:
    crasher = Crasher(after_s=100.0)  # crashes every ~100 s: never 2 within a 60 s period
    tree = make([ChildSpec("slow-crasher", crasher.run)], intensity=1, period_s=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(1000)
        nursery.cancel_scope.cancel()
    assert len(crasher.starts) >= 9
    assert tree.report()["slow-crasher"].restarts >= 8


async def test_transient_child_that_returns_is_not_restarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[float] = []

    async def once(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        runs.append(trio.current_time())
        task_status.started()
        await trio.sleep(1)

    tree = make([ChildSpec("once", once, Restart.TRANSIENT)])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert len(runs) == 1
    assert tree.report()["once"].state == "stopped"


async def test_transient_child_that_crashes_is_restarted(autojump_clock: trio.testing.MockClock) -> None:
    crasher = Crasher(after_s=1.0, crashes=1)
    tree = make([ChildSpec("t", crasher.run, Restart.TRANSIENT)])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(50)
        nursery.cancel_scope.cancel()
    assert len(crasher.starts) == 2


async def test_permanent_child_that_returns_is_restarted(autojump_clock: trio.testing.MockClock) -> None:
    runs: list[float] = []

    async def once(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        runs.append(trio.current_time())
        task_status.started()
        await trio.sleep(30)

    tree = make([ChildSpec("p", once, Restart.PERMANENT)])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert len(runs) >= 3


async def test_temporary_child_is_never_restarted(autojump_clock: trio.testing.MockClock) -> None:
    crasher = Crasher(after_s=1.0)
    tree = make([ChildSpec("tmp", crasher.run, Restart.TEMPORARY)])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert len(crasher.starts) == 1
    assert tree.report()["tmp"].state == "failed"


async def test_fatal_errors_are_not_restarted(autojump_clock: trio.testing.MockClock) -> None:
    attempts = 0

    async def refuse(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal attempts
        attempts += 1
        raise BootRefused("empty", "nothing to serve")

    tree = make([ChildSpec("convergence", refuse)])
    with pytest.raises(BaseException) as info:  # noqa: PT011
        async with trio.open_nursery() as nursery:
            await nursery.start(tree.run)
    exc = info.value
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, BootRefused)
    assert attempts == 1


async def test_a_child_failing_before_started_is_retried_and_readiness_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempts: list[float] = []

    async def flaky(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        attempts.append(trio.current_time())
        if len(attempts) < 3:
            raise OSError("not yet")
        task_status.started()
        await trio.sleep_forever()

    tree = make([ChildSpec("flaky", flaky)])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        ready_at = trio.current_time()
        nursery.cancel_scope.cancel()
    assert len(attempts) == 3
    assert ready_at == attempts[-1] > 0


async def test_shutdown_stops_children_in_reverse_order(autojump_clock: trio.testing.MockClock) -> None:
    stopped: list[str] = []

    def child(name: str):  # type: ignore[no-untyped-def]
        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                stopped.append(name)

        return run

    tree = make([ChildSpec("a", child("a")), ChildSpec("b", child("b")), ChildSpec("c", child("c"))])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        with trio.fail_after(1):
            await tree.shutdown()
    assert stopped == ["c", "b", "a"]


async def test_shutdown_gives_a_stuck_child_only_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def stubborn(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.move_on_after(1000, shield=True):
                await trio.sleep(1000)

    tree = make([ChildSpec("stubborn", stubborn, shutdown_timeout_s=3.0)])
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        start = trio.current_time()
        await tree.shutdown()
        assert trio.current_time() - start == pytest.approx(3.0)
        nursery.cancel_scope.cancel()


async def test_a_running_childs_own_substate_is_reported_until_it_clears_or_the_child_restarts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    changes: list[str] = []
    crasher = Crasher(after_s=10.0, crashes=1)
    tree = Supervisor([ChildSpec("listen", crasher.run)], intensity=5, period_s=60,
                      rng=random.Random(7),
                      on_change=lambda: changes.append(tree.report()["listen"].state))
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        tree.report_substate("listen", "reconnecting")
        tree.report_substate("listen", "reconnecting")  # no change: no event
        assert tree.report()["listen"].state == "reconnecting"
        assert tree.children["listen"].state == "running"  # liveness reads the tree's own
        tree.report_substate("listen", None)
        assert tree.report()["listen"].state == "running"
        tree.report_substate("listen", "reconnecting")
        await trio.sleep(11)  # crashed and restarted: the word said before is forgotten
        assert tree.report()["listen"].state == "running"
        nursery.cancel_scope.cancel()
    assert changes[:4] == ["running", "reconnecting", "running", "reconnecting"]
