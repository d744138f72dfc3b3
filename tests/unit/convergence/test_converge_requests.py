"""Converge-and-wait over the change signal: requests coalesce, every waiter gets its attempt.

The loop runs against the fake store in virtual time; a slow store
(``tests/fakes/store.py``) makes "during one attempt" a span of virtual time
that requests can arrive in.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from supervisor.convergence.loop import ConvergenceLoop
from supervisor.convergence.signal import ChangeSignal, ConvergeAnswer
from tests.convergence import doc, make
from tests.fakes.store import FakeStore, RefusingStore, SlowStore


async def _started(rec: ConvergenceLoop, nursery: trio.Nursery) -> None:
    await nursery.start(rec.run)


async def _until(predicate: object) -> None:
    assert callable(predicate)
    while not predicate():
        await trio.sleep(0.001)


async def test_the_answer_is_the_attempt_that_ran_after_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=3600.0)
    async with trio.open_nursery() as nursery:
        await _started(rec, nursery)
        assert await rec.signal.converge(10) == ConvergeAnswer("converged", 1)
        store.put(doc("a", "b"))
        assert await rec.signal.converge(10) == ConvergeAnswer("published", 2)
        assert rec.state.snapshot is not None and rec.state.snapshot.revision == 2
        store.put(doc("a", keys={"k": ["nope"]}))  # projection: only a new body fixes it
        assert await rec.signal.converge(10) == ConvergeAnswer("rejected", 3, "projection")
        # Asked again, the memo answers without hydrating: still a rejection, still named.
        assert await rec.signal.converge(10) == ConvergeAnswer("rejected", 3, "projection")
        store.outage = True
        assert await rec.signal.converge(10) == ConvergeAnswer("failed", None, "unavailable")
        nursery.cancel_scope.cancel()


async def test_ten_requests_during_one_attempt_share_the_next_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = SlowStore(delay_s=1.0)
    store.put(doc("a"))
    rec = make(store, poll_interval_s=3600.0)
    answers: list[ConvergeAnswer | None] = []

    async def ask() -> None:
        answers.append(await rec.signal.converge(60))

    async with trio.open_nursery() as nursery:
        await _started(rec, nursery)
        # The loop's first attempt after the bootstrap is reading (for a second).
        await _until(lambda: store.in_flight == 1)
        attempts_before = rec.attempts
        # Published while the running attempt is already reading: only an
        # attempt that starts after the requests can see it.
        store.put(doc("a", "b"))
        async with trio.open_nursery() as askers:
            for _ in range(10):
                askers.start_soon(ask)
        nursery.cancel_scope.cancel()
    assert answers == [ConvergeAnswer("published", 2)] * 10
    # The attempt in flight, then exactly one more for all ten.
    assert rec.attempts == attempts_before + 1
    assert rec.signal.requests == 10


async def test_a_waiter_that_gives_up_does_not_disturb_the_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = SlowStore(delay_s=5.0)
    store.put(doc("a"))
    rec = make(store, poll_interval_s=3600.0)
    async with trio.open_nursery() as nursery:
        await _started(rec, nursery)
        abandoned = rec.signal.request()
        with trio.move_on_after(0.5):  # the caller's deadline: shorter than the attempt
            await abandoned.done.wait()
        assert abandoned.answer is None
        # The loop still runs that attempt, answers into the void, and serves the next caller.
        store.put(doc("a", "b"))
        assert await rec.signal.converge(60) == ConvergeAnswer("published", 2)
        assert abandoned.done.is_set() and abandoned.answer is not None
        assert await rec.signal.converge(60) == ConvergeAnswer("converged", 2)
        nursery.cancel_scope.cancel()


async def test_an_attempt_that_crashes_still_answers_its_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = RefusingStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=3600.0)
    request = None
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            await _started(rec, nursery)
            await _until(lambda: rec.attempts == 1)
            store.observe_error = RuntimeError("a bug in the store")
            request = rec.signal.request()
    assert caught.group_contains(RuntimeError)
    assert request is not None and request.done.is_set()
    assert request.answer == ConvergeAnswer("failed")
    # A request made while nothing consumes it stays queued for the restarted loop.
    queued = rec.signal.request()
    store.observe_error = None
    successor = make(store, poll_interval_s=3600.0, signal=rec.signal, state=rec.state)
    async with trio.open_nursery() as nursery:
        await _started(successor, nursery)
        await queued.done.wait()
        nursery.cancel_scope.cancel()
    assert queued.answer == ConvergeAnswer("converged", 1)


async def test_notify_bursts_still_coalesce_next_to_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    signal = ChangeSignal()
    for _ in range(50):
        signal.notify("sighup")
    request = signal.request()
    signal.notify("notify")  # coalesced into the pending sighup
    wakeup = await signal.next_wakeup()
    assert wakeup.trigger == "sighup" and wakeup.requests == [request]
    assert signal.sent == 1 and signal.coalesced == 50
    signal.notify("notify")  # nothing pending any more: sent
    assert (await signal.next_wakeup()).trigger == "notify"
    # A request first, SIGHUP second: the attempt still runs as SIGHUP's.
    first = signal.request()
    signal.notify("sighup")
    wakeup = await signal.next_wakeup()
    assert wakeup.trigger == "sighup" and wakeup.requests == [first]
    assert signal.pending() is None
    # An observer taking a request through wait() answers it rather than losing it.
    late = signal.request()
    assert await signal.wait() == "request"
    assert late.answer == ConvergeAnswer("failed")


async def test_no_wakeup_of_a_fresh_signal_is_taken_for_a_sighup() -> None:
    notified = ChangeSignal()
    notified.notify("notify")
    assert (await notified.next_wakeup()).trigger == "notify"
    asked = ChangeSignal()
    request = asked.request()
    wakeup = await asked.next_wakeup()
    assert wakeup.trigger == "request" and wakeup.requests == [request]
