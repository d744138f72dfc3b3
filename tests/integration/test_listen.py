"""The LISTEN child against a real server: wake-ups, reconnects, prompt shutdown."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane import listen
from supervisor.controlplane.factory import open_admin
from supervisor.controlplane.listen import run_listener
from supervisor.convergence.signal import ChangeSignal
from supervisor.telemetry import Metrics
from tests.polling import poll_until
from tests.proc import free_port
from tests.tcpproxy import pg_proxy, proxied_url


def fast(url: str) -> ControlPlaneConfig:
    """A config whose reconnect backoff is short enough for a test to watch."""
    return ControlPlaneConfig(url=url, backoff_initial_s=0.02, backoff_max_s=0.1)


def doc(**extra: Any) -> bytes:
    return json.dumps({"schema_version": 1, "aliases": {}, **extra}).encode()


def sample(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(f"supervisor_{name}")
    return 0.0 if value is None else value


async def sql(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    def run() -> list[tuple[Any, ...]]:
        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    return await trio.to_thread.run_sync(run)


async def migrated(url: str) -> None:
    store = open_admin(ControlPlaneConfig(url=url), max_schema_version=1)
    await store.migrate()
    await store.aclose()


async def publish(url: str, body: bytes) -> int:
    store = open_admin(ControlPlaneConfig(url=url), max_schema_version=1)
    try:
        return await store.publish(body, 1, None)
    finally:
        await store.aclose()


async def listener_pids(url: str) -> list[int]:
    rows = await sql(
        url,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'trio-supervisor' AND query LIKE 'LISTEN%%'",
    )
    return [int(r[0]) for r in rows]


async def test_a_notification_wakes_the_signal(pg_url: str) -> None:
    await migrated(pg_url)
    signal, metrics = ChangeSignal(), Metrics(process=False)
    config = fast(pg_url)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_listener, config, signal.notify, metrics)
            assert await signal.wait() == "reconnect"  # the first connect counts too
            assert sample(metrics, "listen_connected") == 1
            await publish(pg_url, doc())
            assert await signal.wait() == "notify"
            assert sample(metrics, "listen_notifications_total") == 1
            await publish(pg_url, doc(n=2))
            assert await signal.wait() == "notify"
            assert sample(metrics, "listen_notifications_total") == 2
            nursery.cancel_scope.cancel()
    assert sample(metrics, "listen_connected") == 0
    assert sample(metrics, "listen_reconnects_total") == 0


async def test_a_burst_coalesces_into_one_pending_wake_up(pg_url: str) -> None:
    await migrated(pg_url)
    signal, metrics = ChangeSignal(), Metrics(process=False)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_listener, ControlPlaneConfig(url=pg_url), signal.notify, metrics)
            assert await signal.wait() == "reconnect"
            for n in range(5):
                await publish(pg_url, doc(n=n))
            await poll_until(lambda: sample(metrics, "listen_notifications_total") == 5)
            assert await signal.wait() == "notify"
            with pytest.raises(trio.WouldBlock):
                signal._receive.receive_nowait()  # nothing else pending
            nursery.cancel_scope.cancel()


async def test_terminated_backend_reconnects_and_says_so(pg_url: str) -> None:
    await migrated(pg_url)
    signal, metrics = ChangeSignal(), Metrics(process=False)
    config = fast(pg_url)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_listener, config, signal.notify, metrics)
            assert await signal.wait() == "reconnect"
            [pid] = await listener_pids(pg_url)
            await sql(pg_url, "SELECT pg_terminate_backend(%s)", (pid,))
            assert await signal.wait() == "reconnect"
            assert sample(metrics, "listen_connected") == 1
            [new_pid] = await listener_pids(pg_url)
            assert new_pid != pid
            await publish(pg_url, doc())
            assert await signal.wait() == "notify"
            nursery.cancel_scope.cancel()


async def test_starts_at_once_and_keeps_retrying_while_the_server_is_down() -> None:
    signal, metrics = ChangeSignal(), Metrics(process=False)
    config = fast(f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_listener, config, signal.notify, metrics)  # no connection needed
            await poll_until(lambda: sample(metrics, "listen_reconnects_total") >= 3)
            assert sample(metrics, "listen_connected") == 0
            assert signal.sent == 0
            # Shutdown while reconnecting (between attempts) is prompt.
            start = trio.current_time()
            nursery.cancel_scope.cancel()
    assert trio.current_time() - start < 0.5


async def test_a_server_that_never_answers_the_setup_is_retried_and_reported_reconnecting(
    pg_url: str,
) -> None:
    # The session's startup passes, then its first statement is never answered:
    # each connect and setup is given up at read_timeout_s and retried.
    await migrated(pg_url)
    signal, metrics = ChangeSignal(), Metrics(process=False)
    reported: list[bool] = []
    async with pg_proxy(free_port(), pg_url) as proxy:
        proxy.stalled = True
        config = ControlPlaneConfig(url=proxied_url(pg_url, proxy.port), read_timeout_s=0.5,
                                    backoff_initial_s=0.02, backoff_max_s=0.1)
        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(run_listener, config, signal.notify, metrics,
                                            reconnecting=reported.append))
                await poll_until(lambda: sample(metrics, "listen_reconnects_total") >= 2)
                assert signal.sent == 0 and sample(metrics, "listen_connected") == 0
                assert reported[-1] is True
                proxy.stalled = False
                assert await signal.wait() == "reconnect"
                assert reported[-1] is False and sample(metrics, "listen_connected") == 1
                nursery.cancel_scope.cancel()


async def test_shutdown_while_waiting_is_prompt(pg_url: str) -> None:
    await migrated(pg_url)
    signal, metrics = ChangeSignal(), Metrics(process=False)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_listener, ControlPlaneConfig(url=pg_url), signal.notify, metrics)
            assert await signal.wait() == "reconnect"
            start = trio.current_time()
            nursery.cancel_scope.cancel()
        assert trio.current_time() - start < 0.5
        assert sample(metrics, "listen_connected") == 0
        # The connection was closed, not leaked.
        await poll_until(lambda: _none(listener_pids(pg_url)))


async def _none(pids: Awaitable[list[int]]) -> bool:
    return not await pids


class SilentServer:
    def __init__(self) -> None:
        self.port = 0
        self.arrived = trio.Event()


@asynccontextmanager
async def silent_server() -> AsyncIterator[SilentServer]:
    """A port that accepts connections and never says a word: a connect hangs on it."""
    server = SilentServer()

    async def handler(stream: trio.SocketStream) -> None:
        server.arrived.set()
        async with stream:
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        server.port = listeners[0].socket.getsockname()[1]
        yield server
        nursery.cancel_scope.cancel()


async def test_shutdown_while_connecting_to_an_unresponsive_server_is_prompt() -> None:
    signal, metrics = ChangeSignal(), Metrics(process=False)
    async with silent_server() as server:
        config = fast(f"postgresql://postgres@127.0.0.1:{server.port}/x")
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(run_listener, config, signal.notify, metrics)
                await server.arrived.wait()  # the connect is now stuck in its worker thread
                start = trio.current_time()
                nursery.cancel_scope.cancel()
            assert trio.current_time() - start < 0.5


class FreezableProxy:
    """A loopback TCP proxy whose open connections can be frozen: bytes stop
    flowing both ways but nothing is closed, as on a half-open connection.
    Connections made after the freeze flow normally."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self._frozen_below = 0  # connections numbered below this are frozen

    def freeze_existing(self) -> None:
        self._frozen_below = self.connections

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1")
            )
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started()

    async def _handle(self, client: trio.SocketStream) -> None:
        number = self.connections
        self.connections += 1
        upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        async with client, upstream, trio.open_nursery() as nursery:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                try:
                    async for chunk in src:
                        if number < self._frozen_below:
                            await trio.sleep_forever()  # swallow it, and all that follows
                        await dst.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, client, upstream)
            nursery.start_soon(pump, upstream, client)


async def test_a_half_open_connection_is_caught_by_the_probe(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await migrated(pg_url)
    monkeypatch.setattr(listen, "PROBE_TIMEOUT_S", 0.3)
    signal, metrics = ChangeSignal(), Metrics(process=False)
    proxy = FreezableProxy(int(str(psycopg.conninfo.conninfo_to_dict(pg_url)["port"])))
    dbname = pg_url.rpartition("/")[2]
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            config = fast(f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}")
            await nursery.start(
                partial_listener(config, signal, metrics, probe_interval_s=0.2)
            )
            assert await signal.wait() == "reconnect"
            proxy.freeze_existing()  # the server never hears of it; no FIN, no RST
            assert await signal.wait() == "reconnect"  # probe timed out, reconnected
            await publish(pg_url, doc())
            assert await signal.wait() == "notify"
            nursery.cancel_scope.cancel()


def partial_listener(
    config: ControlPlaneConfig, signal: ChangeSignal, metrics: Metrics, *, probe_interval_s: float
) -> Callable[..., Awaitable[None]]:
    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await run_listener(
            config, signal.notify, metrics, probe_interval_s=probe_interval_s,
            task_status=task_status
        )

    return run


async def test_sqlite_or_listen_off_idles_until_cancelled(
    sqlite_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    # No I/O at all on this path, so virtual time: a day passes instantly.
    for config in (
        ControlPlaneConfig(url=sqlite_url),
        ControlPlaneConfig(url="postgresql://postgres@127.0.0.1:1/x", listen=False),
    ):
        signal, metrics = ChangeSignal(), Metrics(process=False)
        async with trio.open_nursery() as nursery:
            await nursery.start(run_listener, config, signal.notify, metrics)
            await trio.sleep(86400)
            assert signal.sent == 0 and sample(metrics, "listen_reconnects_total") == 0
            nursery.cancel_scope.cancel()
