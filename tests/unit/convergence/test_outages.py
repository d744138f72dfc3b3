"""An unreachable control plane: the snapshot serves on, attempts back off, the outage is told.

Retries back off from ``backoff_initial_s`` to ``backoff_max_s`` (jittered, never
sooner than the floor whatever wakes the loop) and reset after a success; the
outage is logged at its start, once a minute and at its end, and the LISTEN child
is poked at both; reachability changes are published once each, and any answer
(a publish, a refusal, a refused read) says the control plane is back. Fake
store, virtual time.
"""

from __future__ import annotations

import itertools

import pytest
import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.convergence.loop import ConvergenceLoop
from supervisor.convergence.outcome import OutcomeKind
from tests.convergence import doc, events_of, make, sample, watched
from tests.fakes.store import FakeStore, RefusingStore


async def test_outage_backs_off_to_the_cap_keeps_serving_and_recovers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=0.25, backoff_max_s=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        serving = rec.state.snapshot
        await trio.sleep(1)
        store.outage = True
        outage_start = trio.current_time()
        store.calls.clear()
        await trio.sleep(300)
        attempts = [t for what, t in store.calls if what == "desired"]
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        # Grows (never a hot loop) and is capped at backoff_max_s.
        assert gaps[0] < 1.0
        assert max(gaps) <= 30.0 + 1e-9
        assert gaps[-1] >= 15.0  # jitter keeps at least half of the capped delay
        assert len(attempts) < 30
        assert rec.state.snapshot is serving
        assert rec.status.report().last_rejection is None  # an outage is no rejection
        # Lag counts from the first failed observation (the next poll after the outage began).
        assert rec.status.report().lag_s >= 300 - 5.0 - (outage_start - 1)
        assert rec.status.report().consecutive_failures == len(attempts)
        assert sample(rec.report.metrics, "supervisor_control_plane_up") == 0
        assert rec.status.report().control_plane_up is False
        assert rec.status.report().last_error.startswith("unavailable")
        store.outage = False
        store.put(doc("a", "b"))
        recovery = trio.current_time()
        while rec.state.generation < 2:
            await trio.sleep(0.5)
        assert trio.current_time() - recovery <= 30.0
        assert rec.status.report().consecutive_failures == 0
        assert rec.status.report().lag_s == 0.0
        assert sample(rec.report.metrics, "supervisor_control_plane_up") == 1
        assert rec.status.report().control_plane_up is True
        assert rec.status.report().last_error is None
        nursery.cancel_scope.cancel()


async def test_retry_delays_back_off_on_outage_and_reset_after_success() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=1.0, backoff_max_s=30.0)

    async def delay_after_an_attempt() -> float | None:
        await rec.converge_once()
        return rec.retry_in_s

    assert await delay_after_an_attempt() == 5.0
    store.outage = True
    delays = [await delay_after_an_attempt() for _ in range(4)]
    assert all(d is not None for d in delays)
    nominal = [1.0, 2.0, 4.0, 8.0]
    assert all(n * 0.5 <= d <= n for d, n in zip(delays, nominal, strict=True))  # type: ignore[operator]
    store.outage = False
    assert await delay_after_an_attempt() == 5.0
    store.outage = True
    first_again = await delay_after_an_attempt()
    assert first_again is not None and first_again <= 1.0


@pytest.mark.parametrize("floor", [2.0, 0.5])
async def test_the_backoff_floor_holds_against_wakeups_and_resets_on_success(
    autojump_clock: trio.testing.MockClock, floor: float,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=floor, backoff_max_s=30.0)
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            store.outage = True
            store.calls.clear()
            await trio.sleep(5.0)  # poll -> failure
            for _ in range(80):
                rec.signal.notify("sighup")  # a storm of wake-ups
                await trio.sleep(0.1)
            times = [t for what, t in store.calls]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert len(gaps) >= 2 and min(gaps) >= floor - 1e-9  # never before the floor
            store.outage = False
            while rec.status.control_plane_up is not True:
                await trio.sleep(0.1)
            assert rec.schedule.backoff.failures == 0
            nursery.cancel_scope.cancel()


async def test_two_minute_outage_logs_start_progress_and_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    changes: list[bool] = []
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=0.25, backoff_max_s=30.0,
               on_outage_change=changes.append)
    with trio.fail_after(600), structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            store.outage = True
            await trio.sleep(120)
            store.outage = False
            while rec.status.control_plane_up is not True:
                await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
    events = [e["event"] for e in logs if e["log_level"] in ("warning", "info", "error")]
    outage = [e for e in events if "control plane" in e and "reachable" in e]
    assert outage[0] == "control plane unreachable"
    assert 1 <= outage.count("control plane still unreachable") <= 2  # once a minute
    assert outage[-1] == "control plane reachable again"
    [end] = [e for e in logs if e["event"] == "control plane reachable again"]
    assert end["after_s"] >= 120 and end["attempts"] >= 5
    assert changes == [True, False]  # the LISTEN child is poked at start and end


async def test_reachability_changes_are_published_once_each() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    await rec.converge_once()
    store.outage = True
    await rec.converge_once()
    await rec.converge_once()
    store.outage = False
    await rec.converge_once()
    ups = [e["control_plane_up"] for e in events_of(seen) if e["type"] == "status"]
    assert ups == [True, False, True]
    assert sample(rec.report.metrics, "supervisor_control_plane_up") == 1


async def test_a_notified_hydrate_after_an_outage_says_the_control_plane_is_back() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    store.outage = True
    await rec.converge_once()
    store.outage = False
    store.put(doc("a", "b"))
    assert (await rec.converge_once("notify")).kind is OutcomeKind.PUBLISHED
    ups = [e["control_plane_up"] for e in events_of(seen) if e["type"] == "status"]
    assert ups == [True, False, True]


async def test_a_refused_read_after_an_outage_says_the_control_plane_is_back() -> None:
    store = RefusingStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    store.outage = True
    await rec.converge_once()
    assert rec.status.report().control_plane_up is False
    store.outage = False
    store.put(doc("a", "b"))
    store.hydrate_error = ControlPlaneError("permission denied for table revisions",
                                            category=FailureCategory.DENIED)
    # Observe answered; the hydrate's refusal keeps the control plane up.
    outcome = await rec.converge_once("notify")
    assert outcome.failed and outcome.reason == reasons.DENIED and outcome.revision is None
    assert rec.status.report().control_plane_up is True
    assert sample(rec.report.metrics, "supervisor_control_plane_up") == 1
    ups = [e["control_plane_up"] for e in events_of(seen) if e["type"] == "status"]
    assert ups == [True, False, True]


async def test_hydrate_failures_set_reachability_and_what_is_desired() -> None:
    store = RefusingStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    store.hydrate_error = ControlPlaneError("connection reset",
                                            category=FailureCategory.UNAVAILABLE)
    await rec.converge_once()  # observe answers, hydrate does not
    assert rec.status.report().control_plane_up is False
    assert sample(rec.report.metrics, "supervisor_control_plane_up") == 0
    # A refusal about a revision proves the control plane answers, and says what is desired.
    store.hydrate_error = None
    store.put(doc("a", "c"))
    store.corrupt.add(3)
    outcome = await rec.converge_once("notify")
    assert outcome.reason == reasons.CORRUPT
    assert rec.status.report().control_plane_up is True
    assert rec.status.report().desired == 3
    assert sample(rec.report.metrics, "supervisor_desired_revision") == 3
    # A refusal about no revision (the pointer's read denied) says nothing of what is desired.
    store.put(doc("a", "d"))
    store.hydrate_error = ControlPlaneError("permission denied for table supervisor_desired",
                                            category=FailureCategory.DENIED)
    outcome = await rec.converge_once("notify")
    assert (outcome.reason, outcome.revision) == (reasons.DENIED, None)
    assert rec.status.report().desired == 4


async def test_a_refusal_about_a_revision_says_it_is_desired_and_a_failure_about_one_does_not(
) -> None:
    store = RefusingStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    # The hydrate read revision 3 (published after the observe) and refused it.
    store.hydrate_error = ControlPlaneError("digest mismatch", category=FailureCategory.CORRUPT,
                                            revision=3)
    await rec.converge_once()
    assert rec.status.report().desired == 3
    # A read of revision 4 that failed (it may succeed later) says nothing of what is desired.
    store.hydrate_error = ControlPlaneError("connection reset",
                                            category=FailureCategory.UNAVAILABLE, revision=4)
    await rec.converge_once()
    report = rec.status.report()
    assert (report.desired, report.control_plane_up) == (2, False)


async def _serving_with_a_refused_one_desired(
        changes: list[bool]) -> tuple[FakeStore, ConvergenceLoop]:
    """A loop serving revision 1 whose store desires revision 2, which it refuses for good."""
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, on_outage_change=changes.append)
    await rec.converge_once()
    store.put(doc("a", keys={"k": ["nope"]}))
    return store, rec


async def test_an_outage_inside_a_refusal_streak_ending_in_a_success_is_told_once_each(
        autojump_clock: trio.testing.MockClock) -> None:
    changes: list[bool] = []
    store, rec = await _serving_with_a_refused_one_desired(changes)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            assert (await rec.converge_once()).reason == reasons.PROJECTION
            await trio.sleep(rec.retry_in_s)
        store.outage = True
        for _ in range(8):  # past a minute: the outage's progress once
            assert (await rec.converge_once()).reason == reasons.UNAVAILABLE
            await trio.sleep(rec.retry_in_s)
        assert changes == [True]
        store.outage = False
        store.put(doc("a", "c"))
        assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED
        assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    told = [e["event"] for e in logs if e["log_level"] != "debug"]
    assert told.count("control plane unreachable") == 1
    assert told.count("control plane reachable again") == 1
    assert told.count("revision refused; previous snapshot keeps serving") == 1
    assert told.count("revision refusal recovered") == 1
    assert changes == [True, False]
    assert rec.status.report().consecutive_failures == 0


async def test_an_outage_ending_in_a_remembered_refusal_is_told_ended_at_once(
        autojump_clock: trio.testing.MockClock) -> None:
    """The control plane answering with a refusal is reachable: the outage ends there,
    and the LISTEN child is told so, not only at the next success."""
    changes: list[bool] = []
    store, rec = await _serving_with_a_refused_one_desired(changes)
    assert (await rec.converge_once()).reason == reasons.PROJECTION
    store.outage = True
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            assert (await rec.converge_once()).reason == reasons.UNAVAILABLE
            await trio.sleep(rec.retry_in_s)
        store.outage = False
        outcome = await rec.converge_once()
        assert outcome.repeated and outcome.reason == reasons.PROJECTION
        await rec.converge_once()
    told = [e["event"] for e in logs if e["log_level"] != "debug"]
    assert told.count("control plane reachable again") == 1
    assert changes == [True, False]
    assert rec.status.report().control_plane_up is True


async def test_a_restart_during_an_outage_tells_it_anew_and_its_end_once(
        autojump_clock: trio.testing.MockClock) -> None:
    """The telling is the child's: a restarted one says the outage began (and pokes the
    LISTEN child) at its first failure, and ends it once; the status keeps the count."""
    store = FakeStore()
    store.put(doc("a"))
    first_changes: list[bool] = []
    changes: list[bool] = []
    first = make(store, on_outage_change=first_changes.append)
    await first.converge_once()
    store.outage = True
    with structlog.testing.capture_logs() as logs:
        await first.converge_once()
        await first.converge_once()
        restarted = make(store, status=first.status, on_outage_change=changes.append)
        await restarted.converge_once()
        await trio.sleep(restarted.retry_in_s)
        await restarted.converge_once()
        assert restarted.status.report().consecutive_failures == 4
        store.outage = False
        assert (await restarted.converge_once()).kind is OutcomeKind.CONVERGED
        assert (await restarted.converge_once()).kind is OutcomeKind.CONVERGED
    told = [e["event"] for e in logs if e["log_level"] != "debug"]
    assert told.count("control plane unreachable") == 2  # each loop's first failure
    assert told.count("control plane reachable again") == 1
    assert (first_changes, changes) == ([True], [True, False])
    assert restarted.status.report().consecutive_failures == 0
