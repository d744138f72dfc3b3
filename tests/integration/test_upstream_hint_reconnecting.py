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
