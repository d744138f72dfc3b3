"""The per-kind work queue: deduplication, one worker per key, bounded concurrency."""

from __future__ import annotations

import trio
import trio.testing

from supervisor.fanout.engine import WorkQueue


async def test_a_queued_key_is_not_queued_twice() -> None:
    queue = WorkQueue()
    for key in ("a", "b", "a", "a"):
        queue.add(key)
    assert len(queue) == 2
    assert [await queue.get(), await queue.get()] == ["a", "b"]


async def test_a_key_added_while_processing_runs_again_after() -> None:
    queue = WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.add("a")  # while "a" is processed
    queue.add("a")
    assert len(queue) == 0  # never handed to a second worker concurrently
    queue.done(key)
    assert len(queue) == 1
    assert await queue.get() == "a"
    queue.done("a")
    assert queue.idle()


async def test_pending_tells_whether_a_key_will_be_taken_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue = WorkQueue()
    assert not queue.pending("a")
    queue.add("a")
    assert queue.pending("a")  # queued
    key = await queue.get()
    assert not queue.pending("a")  # taken, nothing more to do
    queue.add("a")
    assert queue.pending("a")  # added while processed
    queue.done(key)
    queue.done(await queue.get())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.add_after, "a", 1.0)
        await trio.testing.wait_all_tasks_blocked()
        assert queue.pending("a") and len(queue) == 0  # delayed
    assert queue.pending("a") and len(queue) == 1


async def test_add_after_delays_and_the_sooner_delay_wins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """As client-go's delaying queue: one pending delay per key, the sooner one.

    A long retry-after-failure wait already pending must not hold back a sooner
    requeue (a deferred drift repair due in 1 s); a later delay asked while a
    sooner one is pending is dropped; the superseded wait adds nothing when it ends.
    """
    queue = WorkQueue()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.add_after, "a", 5.0)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(queue.add_after, "a", 1.0)  # sooner: wins
        await trio.sleep(0.5)
        nursery.start_soon(queue.add_after, "a", 3.0)  # later than the pending 1 s: dropped
        await trio.sleep(0.4)
        assert len(queue) == 0 and not queue.idle()
        await trio.sleep(0.2)
        assert len(queue) == 1
        queue.done(await queue.get())
        assert queue.idle() and not queue.pending("a")
        await trio.sleep(10.0)  # the superseded 5 s and the dropped 3 s add nothing
        assert len(queue) == 0 and queue.idle()


async def test_workers_bound_the_concurrency(autojump_clock: trio.testing.MockClock) -> None:
    queue = WorkQueue()
    running = 0
    peak = 0
    done: list[str] = []

    async def worker() -> None:
        nonlocal running, peak
        while True:
            key = await queue.get()
            running += 1
            peak = max(peak, running)
            await trio.sleep(1.0)
            running -= 1
            done.append(key)
            queue.done(key)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(worker)
        for i in range(10):
            queue.add(f"k{i}")
        await queue.wait_idle()
        nursery.cancel_scope.cancel()
    assert peak == 3
    assert sorted(done) == sorted(f"k{i}" for i in range(10))


async def test_a_superseded_delay_ends_its_wait_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No task sleeps on for a delay that no longer counts.

    A 429's Retry-After of an hour, superseded by each sooner requeue (every
    event that queues the parent, fails it again and requeues it), kept one
    task asleep per superseded delay for the rest of its hour.
    """
    queue = WorkQueue()
    ended: list[float] = []

    async def requeue(delay_s: float) -> None:
        await queue.add_after("a", delay_s)
        ended.append(trio.current_time())

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for delay_s in (3600.0, 3000.0, 2000.0):
                nursery.start_soon(requeue, delay_s)
                await trio.sleep(1.0)
            # The first two were superseded at 1 s and 2 s; the last one still waits.
            assert ended == [1.0, 2.0]
            assert queue.pending("a") and len(queue) == 0
            nursery.cancel_scope.cancel()


async def test_wait_idle_returns_when_the_only_pending_delay_is_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancelled delay adds nothing; the queue is idle then, and its waiter told."""
    queue = WorkQueue()
    returned: list[float] = []

    async def waiter() -> None:
        await queue.wait_idle()
        returned.append(trio.current_time())

    with trio.fail_after(10):
        async with trio.open_nursery() as outer:
            async with trio.open_nursery() as delays:
                delays.start_soon(queue.add_after, "a", 3600.0)
                await trio.testing.wait_all_tasks_blocked()
                outer.start_soon(waiter)
                await trio.sleep(1.0)
                assert returned == []  # waiting for the delayed key
                delays.cancel_scope.cancel()  # the engine's nursery going away, say
            await trio.sleep(1.0)
            assert queue.idle() and not queue.pending("a")
            assert returned == [1.0]
