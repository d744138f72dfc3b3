"""The stream hub over a fake ASGI WebSocket transport (virtual time)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from supervisor.admin.stream import StreamHub, StreamSettings
from supervisor.events import Published, StatusChanged
from supervisor.status_doc import ChildReport, StatusDocument
from tests.adminserver import counter_value, make_ctx, published, rejected

PEER = ("127.0.0.1", 1234)


class FakeSocket:
    """The server side of one WebSocket as the app sees it. ``gate``, when set,
    holds every ``websocket.send`` until it is set (a peer that stopped reading)."""

    def __init__(self) -> None:
        self.inbound_send, self.inbound = trio.open_memory_channel[dict[str, Any]](10)
        self.outbound_send, self.outbound = trio.open_memory_channel[dict[str, Any]](math.inf)
        self.gate: trio.Event | None = None
        self.scope = {"type": "websocket", "path": "/v1/stream", "client": PEER}

    async def receive(self) -> dict[str, Any]:
        return await self.inbound.receive()

    async def send(self, message: dict[str, Any]) -> None:
        if self.gate is not None and message["type"] == "websocket.send":
            await self.gate.wait()
        self.outbound_send.send_nowait(message)

    async def next(self) -> dict[str, Any]:
        return await self.outbound.receive()

    async def next_json(self) -> dict[str, Any]:
        message = await self.next()
        assert message["type"] == "websocket.send", message
        doc = msgspec.json.decode(message["text"])
        assert isinstance(doc, dict)
        return doc

    def resetting_abort(
            self, aborted: list[tuple[str, int]] | None = None) -> Callable[[tuple[str, int]], bool]:
        """An ``abort`` for the hub that does what a TCP reset does to a blocked write: it returns.

        Each peer it is called for is appended to ``aborted``, when given.
        """
        def abort(peer: tuple[str, int]) -> bool:
            if aborted is not None:
                aborted.append(peer)
            assert self.gate is not None
            self.gate.set()
            return True

        return abort

    async def connect(self, nursery: trio.Nursery, hub: StreamHub) -> None:
        """Served by ``hub``, past the accept and the first status document."""
        nursery.start_soon(hub.serve, self.scope, self.receive, self.send)
        await self.next()
        await self.next()


def make_hub(settings: StreamSettings | None = None, **kwargs: Any) -> tuple[Any, StreamHub]:
    ctx = make_ctx()
    return ctx, StreamHub(ctx.events, ctx.status, ctx.metrics, settings, **kwargs)


async def test_status_first_then_events_in_order() -> None:
    with trio.fail_after(5):
        ctx, hub = make_hub()
        sock = FakeSocket()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hub.serve, sock.scope, sock.receive, sock.send)
            assert (await sock.next())["type"] == "websocket.accept"
            first = await sock.next_json()
            assert first["type"] == "status"
            assert set(first) == {"type", "revision", "children", "fanout", "leadership", "sinks",
                                  "version", "started_at", "threads_past_deadline",
                                  "heartbeat_s"}
            assert first["children"]["convergence"]["state"] == "running"
            assert hub.client_count == 1
            assert ctx.metrics.stream_clients._value.get() == 1
            ctx.events.emit(published(7))
            ctx.events.emit(rejected(8, "projection"))
            ctx.events.emit(StatusChanged(children={"convergence": ChildReport(
                state="backoff", restarts=1, last_error="boom")}))
            docs = [await sock.next_json() for _ in range(3)]
            assert [d["type"] for d in docs] == ["published", "rejected", "status"]
            assert [d["seq"] for d in docs] == [1, 2, 3]
            assert docs[0]["revision"] == 7
            assert docs[1]["reason"] == "projection"
            # The client leaves: everything is released.
            await sock.inbound_send.send({"type": "websocket.disconnect", "code": 1000})
        assert hub.client_count == 0
        assert ctx.events.subscriber_count == 0
        assert ctx.metrics.stream_clients._value.get() == 0


async def test_heartbeat_ping_when_idle(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(100):
        _, hub = make_hub(StreamSettings(heartbeat_s=15.0))
        sock = FakeSocket()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hub.serve, sock.scope, sock.receive, sock.send)
            await sock.next()
            start = trio.current_time()
            assert (await sock.next_json())["heartbeat_s"] == 15.0
            ping = await sock.next_json()
            assert ping["type"] == "ping"
            assert trio.current_time() - start == pytest.approx(15.0)
            nursery.cancel_scope.cancel()


async def test_burst_beyond_buffer_closes_with_1013() -> None:
    with trio.fail_after(5):
        ctx, hub = make_hub(StreamSettings(max_buffer=4))
        sock = FakeSocket()
        async with trio.open_nursery() as nursery:
            await sock.connect(nursery, hub)
            # No checkpoint in between: the first goes straight to the waiting
            # writer, four fill the buffer, the sixth overflows it.
            for i in range(6):
                ctx.events.emit(published(i))
            assert (await sock.next_json())["revision"] == 0
            close = await sock.next()
            assert close == {"type": "websocket.close", "code": 1013, "reason": "client too slow"}
        assert counter_value(ctx.metrics.stream_dropped) == 1
        assert hub.client_count == 0


async def test_close_all_sends_going_away_and_refuses_new() -> None:
    with trio.fail_after(5):
        _, hub = make_hub()
        socks = [FakeSocket() for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for sock in socks:
                await sock.connect(nursery, hub)
            await hub.close_all(timeout_s=1.0)
            assert hub.closing
            for sock in socks:
                assert await sock.next() == {
                    "type": "websocket.close", "code": 1001, "reason": "going away",
                }
        assert hub.client_count == 0


async def test_writer_stalled_too_long_is_reset(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(100):
        aborted: list[tuple[str, int]] = []
        sock = FakeSocket()
        ctx, hub = make_hub(StreamSettings(stall_timeout_s=10.0, monitor_interval_s=0.5),
                            abort=sock.resetting_abort(aborted))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hub.monitor)
            await sock.connect(nursery, hub)
            sock.gate = trio.Event()
            start = trio.current_time()
            ctx.events.emit(published(1))
            while hub.client_count:
                await trio.sleep(0.1)
            assert aborted == [PEER]
            assert 10.0 < trio.current_time() - start <= 11.0
            nursery.cancel_scope.cancel()
        assert counter_value(ctx.metrics.stream_dropped) == 1
        # No close frame: the connection is gone, nothing more is sent.
        assert sock.outbound.statistics().current_buffer_used == 1  # the released event
        assert (await sock.next())["type"] == "websocket.send"


async def test_overflowed_while_blocked_is_reset_sooner(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(100):
        sock = FakeSocket()
        ctx, hub = make_hub(
            StreamSettings(max_buffer=2, stall_timeout_s=60.0, close_timeout_s=2.0,
                           monitor_interval_s=0.5),
            abort=sock.resetting_abort(),
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hub.monitor)
            await sock.connect(nursery, hub)
            sock.gate = trio.Event()
            start = trio.current_time()
            ctx.events.emit(published(0))
            await trio.sleep(0.1)  # the writer takes event 0 and blocks on it
            for i in range(1, 5):
                ctx.events.emit(published(i))
            while hub.client_count:
                await trio.sleep(0.1)
            assert 2.0 < trio.current_time() - start <= 3.0
            nursery.cancel_scope.cancel()
        assert counter_value(ctx.metrics.stream_dropped) == 1


async def test_close_all_resets_clients_that_cannot_take_the_close() -> None:
    with trio.fail_after(5):
        aborted: list[tuple[str, int]] = []
        sock = FakeSocket()
        ctx, hub = make_hub(abort=sock.resetting_abort(aborted))
        async with trio.open_nursery() as nursery:
            await sock.connect(nursery, hub)
            sock.gate = trio.Event()
            ctx.events.emit(published(1))
            await trio.testing.wait_all_tasks_blocked()
            await hub.close_all(timeout_s=0.05)
            assert aborted == [PEER]
        assert hub.client_count == 0
        # Shutdown resets are not "too slow" drops.
        assert counter_value(ctx.metrics.stream_dropped) == 0


async def test_one_encoding_per_event_and_odd_values() -> None:
    with trio.fail_after(5):
        ctx, hub = make_hub()
        socks = [FakeSocket() for _ in range(2)]
        async with trio.open_nursery() as nursery:
            for sock in socks:
                await sock.connect(nursery, hub)
            # A value of the wrong type (a bug) degrades to its text.
            odd = Path("/x/y")
            ctx.events.emit(Published(revision=1, generation=1, source=odd,  # type: ignore[arg-type]
                                      took_s=0.0))
            texts = [(await sock.next())["text"] for sock in socks]
            assert texts[0] is texts[1]  # encoded once, shared
            assert msgspec.json.decode(texts[0])["source"] == "/x/y"
            nursery.cancel_scope.cancel()


async def test_status_failure_releases_the_subscription() -> None:
    with trio.fail_after(5):
        ctx = make_ctx()

        def broken() -> StatusDocument:
            raise RuntimeError("boom")

        hub = StreamHub(ctx.events, broken, ctx.metrics)
        sock = FakeSocket()
        with pytest.raises(RuntimeError):
            await hub.serve(sock.scope, sock.receive, sock.send)
        assert ctx.events.subscriber_count == 0
        assert hub.client_count == 0
