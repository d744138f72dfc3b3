"""What wakes the loop: the poll, a change notification, a request; none of them hydrates for nothing.

A lost notification is made up by the next poll; a notification is served at
once (also right after a success), a burst coalescing into one pending wake-up;
a wake-up against the unchanged active revision only observes. Fake store,
virtual time.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from supervisor.convergence.outcome import OutcomeKind
from tests.convergence import doc, make
from tests.fakes.store import FakeStore


async def test_missed_notification_polling_publishes_within_one_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        await trio.sleep(12.3)
        published_at = trio.current_time()
        store.put(doc("a", "b"))  # no signal: as if the NOTIFY was lost
        while rec.state.generation < 2:
            await trio.sleep(0.01)
        assert trio.current_time() - published_at <= 5.0 + 0.011
        nursery.cancel_scope.cancel()
    assert rec.state.snapshot is not None and rec.state.snapshot.revision == 2


async def test_change_signal_wakes_the_loop_early(autojump_clock: trio.testing.MockClock) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=3600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        await trio.sleep(10)
        store.put(doc("a", "b"))
        store.calls.clear()
        start = trio.current_time()
        for _ in range(50):  # a burst coalesces into at most one pending wake-up
            rec.signal.notify("notify")
        while rec.state.generation < 2:
            await trio.sleep(0.001)
        assert trio.current_time() - start < 0.01
        # Observe decides, hydrate follows the change it saw.
        assert [what for what, _ in store.calls[:2]] == ["desired", "hydrate"]
        nursery.cancel_scope.cancel()
    # One wake-up goes straight to the waiting loop, one stays pending; the rest coalesce.
    assert rec.signal.coalesced >= 48
    assert rec.status.report().desired == 2


async def test_a_wakeup_right_after_a_success_is_served_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=3600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        await trio.sleep(10)
        store.put(doc("a", "b"))
        rec.signal.notify("notify")
        while rec.state.generation < 2:
            await trio.sleep(0.001)
        store.put(doc("a", "c"))  # at once again, right after that success
        start = trio.current_time()
        rec.signal.notify("notify")
        while rec.state.generation < 3:
            await trio.sleep(0.001)
        assert trio.current_time() - start < 0.01
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("trigger", ["notify", "hint", "request", "poll"])
async def test_a_wakeup_against_the_unchanged_active_revision_does_not_hydrate(
        trigger: str) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.calls.clear()
    for _ in range(3):
        assert (await rec.converge_once(trigger)).kind is OutcomeKind.CONVERGED
    assert [what for what, _ in store.calls] == ["desired"] * 3

