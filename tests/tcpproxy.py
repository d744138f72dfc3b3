"""A TCP proxy on loopback that a test can switch off and on: an outage we control.

``async with tcp_proxy(port, target_port) as proxy``: while ``proxy.up`` is
False the port refuses connections and every open connection is cut, exactly
what a daemon sees when its database host goes away and comes back.
``pg_proxy(port, pg_url)`` is one in front of the server ``pg_url`` names, and
``proxied_url(pg_url, port)`` the same URL through it.
``proxy.latency_s`` delays every chunk the server sends: a distant database
(each round trip takes at least that long), the fault itself rather than a wait.
``proxy.rate_bps`` caps what the server sends at that many bytes a second (a
slow link). ``proxy.stalled`` is a database that accepts connections and
never answers a query: a session's startup passes, and from its first query
on nothing travels either way, on open and new connections alike (the
kernel still ACKs, so keepalives never trip), until ``stalled`` is False again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import trio
from psycopg.conninfo import conninfo_to_dict


class TcpProxy:
    def __init__(self, port: int, target_port: int, nursery: trio.Nursery,
                 target_host: str = "127.0.0.1") -> None:
        self.port = port
        self.target_port = target_port
        self.target_host = target_host
        self._nursery = nursery
        self._scope: trio.CancelScope | None = None
        self.connections = 0
        self.latency_s = 0.0
        self.rate_bps: float | None = None
        self.stalled = False

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
            upstream = await trio.open_tcp_stream(self.target_host, self.target_port)
        except OSError:
            await client.aclose()
            return
        asked = False  # the client has sent a query (not only its startup)
        async with client, upstream, trio.open_nursery() as nursery:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                nonlocal asked
                try:
                    async for chunk in src:
                        if src is client and chunk[:1] in _QUERY_MESSAGES:
                            asked = True
                        while self.stalled and asked:
                            await trio.sleep(0.05)
                        if src is upstream and self.latency_s:
                            await trio.sleep(self.latency_s)
                        if src is upstream and self.rate_bps:
                            await self._paced(dst, chunk, self.rate_bps)
                            continue
                        await dst.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, client, upstream)
            nursery.start_soon(pump, upstream, client)


    @staticmethod
    async def _paced(dst: trio.SocketStream, chunk: bytes, rate_bps: float) -> None:
        step = max(1, int(rate_bps / 20))
        for at in range(0, len(chunk), step):
            await dst.send_all(chunk[at:at + step])
            await trio.sleep(step / rate_bps)


# The frontend messages that ask something once a session is up (simple and
# extended query protocol); a startup or cancel packet begins with its length.
_QUERY_MESSAGES = frozenset(bytes([c]) for c in b"QPBEDSHFC")


def _server_of(pg_url: str) -> tuple[str, int]:
    parts = conninfo_to_dict(pg_url)
    return str(parts.get("host") or "127.0.0.1"), int(parts.get("port") or 5432)


def proxied_url(pg_url: str, port: int) -> str:
    """``pg_url`` pointed at a proxy on 127.0.0.1:``port`` instead of its server."""
    host, server_port = _server_of(pg_url)
    through = pg_url.replace(f"@{host}:{server_port}/", f"@127.0.0.1:{port}/", 1)
    assert through != pg_url, f"no @{host}:{server_port}/ in {pg_url}"
    return through


@asynccontextmanager
async def tcp_proxy(port: int, target_port: int, *, up: bool = True,
                    target_host: str = "127.0.0.1") -> AsyncIterator[TcpProxy]:
    async with trio.open_nursery() as nursery:
        proxy = TcpProxy(port, target_port, nursery, target_host)
        if up:
            await proxy.start()
        yield proxy
        nursery.cancel_scope.cancel()


def pg_proxy(port: int, pg_url: str, *, up: bool = True) -> AbstractAsyncContextManager[TcpProxy]:
    """A :func:`tcp_proxy` on ``port`` in front of the server ``pg_url`` names."""
    host, server_port = _server_of(pg_url)
    return tcp_proxy(port, server_port, up=up, target_host=host)
