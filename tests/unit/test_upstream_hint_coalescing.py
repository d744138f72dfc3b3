"""Stream hints coalesce: any number within hint_min_interval_s wake the loop at most once."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from supervisor.controlplane.upstream_hint import IDLE_TIMEOUT_S, _follow

PUBLISHED = json.dumps({"type": "published", "revision": 1})


async def test_a_burst_wakes_once_at_its_start_and_once_after_it(
    autojump_clock: trio.testing.MockClock
) -> None:
    send, receive = trio.open_memory_channel[str](100_000)
    wakes: list[float] = []
    for _ in range(10_000):  # one instant: 10,000 hints
        send.send_nowait(PUBLISHED)
    send.send_nowait('{"type": "status"}')  # not a hint
    with trio.move_on_after(5):
        await _follow(receive.receive, lambda _why: wakes.append(trio.current_time()), 0.1)
    start = wakes[0]
    assert [round(t - start, 6) for t in wakes] == [0.0, 0.1]


async def test_spaced_hints_each_wake_and_silence_past_the_idle_timeout_ends_it(
    autojump_clock: trio.testing.MockClock
) -> None:
    send, receive = trio.open_memory_channel[str](10)
    wakes: list[float] = []

    async def spaced() -> None:
        for _ in range(3):
            await send.send(PUBLISHED)
            await trio.sleep(0.5)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spaced)
        with pytest.raises(trio.TooSlowError):
            await _follow(receive.receive, lambda _why: wakes.append(trio.current_time()), 0.1)
    assert len(wakes) == 3
    assert trio.current_time() == pytest.approx(1.0 + IDLE_TIMEOUT_S)
