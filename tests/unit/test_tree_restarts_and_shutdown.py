"""The supervision tree's restarts and shutdown, as a caller sees them.

Shutdown duration (not only order), the restart backoff's exact bounds and cap,
``crash_looping``, the callbacks, a crash from inside a child (a fault switch), and the
report of each ending. All under virtual time; every assertion is on what a caller can see.
"""

from __future__ import annotations

import gc
import itertools
import random
import weakref

import msgspec
import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from supervisor.errors import BootRefused
from supervisor.tree import BACKOFF_INITIAL_S, BACKOFF_MAX_S, ChildSpec, Restart, Supervisor
from tests.fakes.children import Crasher, FaultSwitch


async def forever(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    await trio.sleep_forever()


def innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def test_backoff_delays_are_exactly_doubling_within_the_jitter_bounds_and_capped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    crasher = Crasher(after_s=1.0)
    tree = Supervisor([ChildSpec("c", crasher.run)], intensity=1000, period_s=1e9,
                      rng=random.Random(3))
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(600)
        nursery.cancel_scope.cancel()
    delays = [b - a - crasher.after_s for a, b in itertools.pairwise(crasher.starts)]
    assert len(delays) >= 12
    for n, delay in enumerate(delays, start=1):
        nominal = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** (n - 1))
        assert nominal * 0.8 - 1e-9 <= delay <= nominal * 1.2 + 1e-9, (n, delay)
    # The first restart waits about half a second, and the cap is 30 s: a
    # delay never exceeds 36 s, and once capped they all sit near 30 s.
    assert 0.4 <= delays[0] <= 0.6
    assert max(delays) <= 36.0
    assert all(24.0 <= d for d in delays[8:])


async def test_crash_looping_is_true_only_in_backoff_after_two_recent_crashes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    crasher = Crasher(after_s=1.0, crashes=3)
    seen: list[tuple[str, bool]] = []
    restarted: list[str] = []
    tree: Supervisor

    def on_change() -> None:
        seen.append((tree.children["c"].state, tree.crash_looping))

    tree = Supervisor([ChildSpec("c", crasher.run)], intensity=10, period_s=1000,
                      on_change=on_change, on_restart=restarted.append, rng=random.Random(1))
    assert tree.crash_looping is False
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(100)
        # Running again after three crashes, all still within the period.
        assert tree.report()["c"].state == "running"
        assert tree.crash_looping is False
        nursery.cancel_scope.cancel()
    backoffs = [looping for state, looping in seen if state == "backoff"]
    assert backoffs == [False, True, True]
    assert all(not looping for state, looping in seen if state != "backoff")
    assert [state for state, _ in seen][:3] == ["running", "backoff", "starting"]
    assert restarted == ["c", "c", "c"]


async def test_shutdown_of_prompt_children_takes_no_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tree = Supervisor([ChildSpec("a", forever), ChildSpec("b", forever, shutdown_timeout_s=60)],
                      intensity=1, period_s=60, rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        start = trio.current_time()
        await tree.shutdown()
        assert trio.current_time() - start == 0
        nursery.cancel_scope.cancel()


async def test_default_shutdown_timeout_is_five_seconds_and_overrun_is_logged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def stubborn(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(1000)

    tree = Supervisor([ChildSpec("stubborn", stubborn)], intensity=1, period_s=60,
                      rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        start = trio.current_time()
        with capture_logs() as logs:
            await tree.shutdown()
        assert trio.current_time() - start == pytest.approx(5.0)
        nursery.cancel_scope.cancel()
    late = [e for e in logs if e["event"] == "child did not stop in time"]
    assert [(e["child"], e["timeout_s"]) for e in late] == [("stubborn", 5.0)]


async def test_a_prompt_shutdown_logs_no_overrun(autojump_clock: trio.testing.MockClock) -> None:
    tree = Supervisor([ChildSpec("a", forever)], intensity=1, period_s=60, rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        with capture_logs() as logs:
            await tree.shutdown()
        nursery.cancel_scope.cancel()
    assert not [e for e in logs if e["event"] == "child did not stop in time"]


async def test_shutdown_from_a_cancelled_caller_still_waits_for_the_children(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cleaned: list[str] = []

    async def slow_cleanup(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.move_on_after(2, shield=True):
                await trio.sleep(1)
                cleaned.append("done")

    tree = Supervisor([ChildSpec("a", slow_cleanup)], intensity=1, period_s=60,
                      rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        with trio.CancelScope() as scope:
            scope.cancel()  # a second signal, or the grace deadline, already hit
            await tree.shutdown()
        assert cleaned == ["done"]
        nursery.cancel_scope.cancel()


async def test_shutdown_before_a_child_ever_started_returns_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tree = Supervisor([ChildSpec("a", forever), ChildSpec("b", forever)], intensity=1,
                      period_s=60, rng=random.Random(1))
    start = trio.current_time()
    await tree.shutdown()
    assert trio.current_time() - start == 0


async def test_a_tree_without_an_rng_still_restarts(autojump_clock: trio.testing.MockClock) -> None:
    crasher = Crasher(after_s=1.0, crashes=1)
    tree = Supervisor([ChildSpec("c", crasher.run)], intensity=5, period_s=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert len(crasher.starts) == 2
    assert msgspec.to_builtins(tree.report()["c"]) == {
        "state": "running", "restarts": 1, "last_error": "RuntimeError: crash #1"}


def test_duplicate_child_names_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate child names"):
        Supervisor([ChildSpec("a", forever), ChildSpec("a", forever)], intensity=1, period_s=1)


async def test_a_crash_inside_a_running_child_restarts_it_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[float] = []

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        runs.append(trio.current_time())
        task_status.started()
        await trio.sleep_forever()

    async def once(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    c, done = FaultSwitch("c", child), FaultSwitch("once", once)
    tree = Supervisor([ChildSpec("c", c), ChildSpec("once", done, Restart.TRANSIENT)],
                      intensity=5, period_s=60, rng=random.Random(1))
    assert c.crash() is False  # not running yet
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(1)
        assert done.crash() is False  # finished: nothing to crash
        assert c.crash() is True
        await trio.sleep(5)
        report = tree.report()
        nursery.cancel_scope.cancel()
    assert len(runs) == 2
    assert report["c"].restarts == 1
    assert report["c"].state == "running"
    assert report["c"].last_error == "InjectedFault: fault injected into child 'c' by a test"
    assert report["once"].state == "stopped" and report["once"].restarts == 0


async def test_a_fatal_error_marks_the_child_failed(autojump_clock: trio.testing.MockClock) -> None:
    async def refuse(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raise BootRefused("empty", "nothing to serve")

    tree = Supervisor([ChildSpec("convergence", refuse)], intensity=5, period_s=60,
                      rng=random.Random(1))
    with pytest.raises(BaseException) as info:  # noqa: PT011 - may be in an ExceptionGroup
        async with trio.open_nursery() as nursery:
            await nursery.start(tree.run)
    assert isinstance(innermost(info.value), BootRefused)
    assert tree.report()["convergence"].state == "failed"


async def test_a_fatal_error_inside_a_group_is_found(autojump_clock: trio.testing.MockClock) -> None:
    async def refuse(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        raise ExceptionGroup("two", [RuntimeError("noise"), BootRefused("cache", "refused")])

    tree = Supervisor([ChildSpec("convergence", refuse)], intensity=5, period_s=60,
                      rng=random.Random(1))
    with pytest.raises(BaseException) as info:  # noqa: PT011
        async with trio.open_nursery() as nursery:
            await nursery.start(tree.run)
    assert isinstance(innermost(info.value), BootRefused)


async def test_a_crash_in_a_one_exception_group_is_described_by_the_inner_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        raise ExceptionGroup("wrapper", [KeyError()])

    tree = Supervisor([ChildSpec("c", child, Restart.TEMPORARY)], intensity=5, period_s=60,
                      rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
    assert msgspec.to_builtins(tree.report()["c"]) == {
        "state": "failed", "restarts": 0, "last_error": "KeyError"}


async def test_a_permanent_child_that_returns_says_so(autojump_clock: trio.testing.MockClock) -> None:
    async def once(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep(10)

    tree = Supervisor([ChildSpec("p", once)], intensity=5, period_s=60, rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        await trio.sleep(10.1)
        report = tree.report()["p"]
        nursery.cancel_scope.cancel()
    assert report.last_error == "returned while permanent"
    assert report.restarts == 1


async def test_a_temporary_child_failing_before_started_does_not_block_readiness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    later = []

    async def broken(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raise OSError("cannot start")

    async def after(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        later.append(trio.current_time())
        task_status.started()
        await trio.sleep_forever()

    tree = Supervisor([ChildSpec("t", broken, Restart.TEMPORARY), ChildSpec("after", after)],
                      intensity=5, period_s=60, rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        with trio.fail_after(5):
            await nursery.start(tree.run)
        nursery.cancel_scope.cancel()
    assert later == [0]
    assert tree.report()["t"].state == "failed"


async def test_a_crashed_run_is_not_kept_alive_during_the_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Owned:
        pass

    refs: list[weakref.ref[Owned]] = []

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        owned = Owned()  # what the run owns; its frame holds it
        refs.append(weakref.ref(owned))
        task_status.started()
        await trio.sleep(1)
        raise RuntimeError("crash")

    in_backoff: list[bool] = []
    tree: Supervisor

    def on_change() -> None:
        if tree.children["c"].state == "backoff" and not in_backoff:
            in_backoff.append(True)

    tree = Supervisor([ChildSpec("c", child)], intensity=5, period_s=60, on_change=on_change,
                      rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        while not in_backoff:
            await trio.sleep(0.01)
        gc.collect()
        assert refs[0]() is None
        nursery.cancel_scope.cancel()


async def test_a_childs_log_lines_name_the_child(autojump_clock: trio.testing.MockClock) -> None:
    import structlog

    seen: dict[str, object] = {}

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # What every log line of this task is bound with (merged by the logging setup).
        seen.update(structlog.contextvars.get_contextvars())
        task_status.started()
        await trio.sleep_forever()

    tree = Supervisor([ChildSpec("listener", child)], intensity=3, period_s=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run)
        nursery.cancel_scope.cancel()
    assert seen.get("child") == "listener"
