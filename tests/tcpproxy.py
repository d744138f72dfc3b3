"""A TCP proxy on loopback that a test can switch off and on: an outage we control.

``async with tcp_proxy(port, target_port) as proxy``: while ``proxy.up`` is
False the port refuses connections and every open connection is cut, exactly
what a daemon sees when its database host goes away and comes back.
``proxy.latency_s`` delays every chunk the server sends: a distant database
(each round trip takes at least that long), the fault itself rather than a wait.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


class TcpProxy:
    def __init__(self, port: int, target_port: int, nursery: trio.Nursery) -> None:
        self.port = port
        self.target_port = target_port
        self._nursery = nursery
        self._scope: trio.CancelScope | None = None
        self.connections = 0
        self.latency_s = 0.0

    @property
    def up(self) -> bool:
        return self._scope is not None

    async def start(self) -> None:
        if self._scope is None:
            self._scope = await self._nursery.start(self._serve)

    def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None

    async def _serve(self, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            async with trio.open_nursery() as nursery:
                task_status.started(scope)
                await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)

    async def _handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        except OSError:
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                try:
                    async for chunk in src:
                        if src is upstream and self.latency_s:
                            await trio.sleep(self.latency_s)
                        await dst.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, client, upstream)
            nursery.start_soon(pump, upstream, client)


def proxied_url(pg_url: str, port: int) -> str:
    """``pg_url`` pointed at a proxy on ``port`` instead of the server on 5432."""
    return pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")


@asynccontextmanager
async def tcp_proxy(port: int, target_port: int = 5432, *, up: bool = True) -> AsyncIterator[TcpProxy]:
    async with trio.open_nursery() as nursery:
        proxy = TcpProxy(port, target_port, nursery)
        if up:
            await proxy.start()
        yield proxy
        nursery.cancel_scope.cancel()
