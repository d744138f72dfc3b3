"""A follower's stream child says ``reconnecting`` while its upstream's stream is not open."""

from __future__ import annotations

from functools import partial

import trio
import trio_websocket

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.upstream_hint import run_upstream_hint
from tests.polling import poll_until
from tests.proc import free_port


async def test_the_stream_child_reports_reconnecting_until_the_stream_opens() -> None:
    port = free_port()
    config = ControlPlaneConfig(url=f"http://127.0.0.1:{port}", backoff_initial_s=0.05,
                                backoff_max_s=0.1)
    said: list[bool] = []

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()  # held open until the test ends

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(run_upstream_hint, config, lambda _why: None,
                                       reconnecting=said.append))
            await poll_until(lambda: said == [True])  # nothing listens yet
            await nursery.start(partial(trio_websocket.serve_websocket, handler, "127.0.0.1",
                                        port, ssl_context=None))
            await poll_until(lambda: said == [True, False])
            nursery.cancel_scope.cancel()


async def test_a_stream_that_delivered_is_followed_again_at_once_after_it_is_cut() -> None:
    # Five upstreams that accept and drop at once grow the backoff toward its maximum;
    # a stream that then delivers (a healthy upstream) and is cut is no sixth failure.
    port = free_port()
    config = ControlPlaneConfig(url=f"http://127.0.0.1:{port}", backoff_initial_s=0.05,
                                backoff_max_s=2.0)
    opened: list[float] = []
    cut_after_delivering: list[float] = []

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        opened.append(trio.current_time())
        if len(opened) == 6:
            await ws.send_message('{"type": "published", "revision": 1}')
            await trio.sleep(0.2)
            cut_after_delivering.append(trio.current_time())
        if len(opened) <= 6:
            await ws.aclose()
            return
        await ws.get_message()  # held open until the test ends

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio_websocket.serve_websocket, handler, "127.0.0.1",
                                        port, ssl_context=None))
            nursery.start_soon(partial(run_upstream_hint, config, lambda _why: None))
            await poll_until(lambda: len(opened) == 7)
            nursery.cancel_scope.cancel()
    assert opened[6] - cut_after_delivering[0] < 0.5, (
        f"followed again {opened[6] - cut_after_delivering[0]:.2f} s after the cut")
