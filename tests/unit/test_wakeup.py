"""The re-armable wake-up's contract, as the LISTEN child's pokes and the preflights' SIGHUP see it.

A wake-up ends every wait in progress and re-arms; a waiter that says what it
has seen (``since``) never loses one that came while it was not waiting; a
wait nobody wakes runs out. Virtual time only.
"""

from __future__ import annotations

import trio
import trio.testing

from supervisor.wakeup import Wakeup


async def test_a_wait_nobody_wakes_runs_out(autojump_clock: trio.testing.MockClock) -> None:
    wakeup = Wakeup()
    start = trio.current_time()
    assert await wakeup.wait(5.0, since=wakeup.count) is False
    assert trio.current_time() - start == 5.0
    assert wakeup.count == 0


async def test_a_wake_ends_every_wait_in_progress_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wakeup = Wakeup()
    woken: list[tuple[int, float]] = []

    async def waiter(index: int) -> None:
        if await wakeup.wait(60.0, since=wakeup.count):
            woken.append((index, trio.current_time()))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for index in range(3):
                nursery.start_soon(waiter, index)
            await trio.sleep(1.0)
            wakeup.wake()  # never blocks, with or without waiters
    assert sorted(woken) == [(0, 1.0), (1, 1.0), (2, 1.0)]
    assert wakeup.count == 1


async def test_a_wake_while_nobody_waits_ends_the_next_wait_that_has_not_seen_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wakeup = Wakeup()
    seen = wakeup.count  # read before the work that precedes the wait
    wakeup.wake()
    wakeup.wake()  # any number of them: one answer
    with trio.fail_after(1):
        assert await wakeup.wait(60.0, since=seen) is True
    assert trio.current_time() == 0.0
    assert wakeup.count == 2


async def test_after_a_wake_it_is_armed_again_for_those_that_saw_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wakeup = Wakeup()
    wakeup.wake()
    start = trio.current_time()
    assert await wakeup.wait(3.0, since=wakeup.count) is False  # seen: not a new one
    assert trio.current_time() - start == 3.0

    async def wake_later() -> None:
        await trio.sleep(2.0)
        wakeup.wake()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wake_later)
            assert await wakeup.wait(60.0, since=wakeup.count) is True
    assert trio.current_time() - start == 5.0
    assert wakeup.count == 2
