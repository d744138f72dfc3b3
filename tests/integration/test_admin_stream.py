"""WS /v1/stream against a real server: order, slow clients, fan-out, shutdown."""

from __future__ import annotations

import msgspec
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from supervisor.admin.stream import StreamSettings
from tests.adminserver import (
    counter_value,
    make_ctx,
    owned_ws,
    published,
    raw_stream_client,
    rejected,
    running_admin,
)


async def next_doc(ws: WebSocketConnection) -> dict[str, object]:
    doc = msgspec.json.decode(await ws.get_message())
    assert isinstance(doc, dict)
    return doc


async def test_status_first_then_published_and_rejected_in_order() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        ctx.revision.observed(7)
        async with running_admin(ctx) as srv, open_websocket_url(srv.ws) as ws:
            first = await next_doc(ws)
            assert first["type"] == "status"
            assert first["revision"]["desired"] == 7  # type: ignore[index]
            assert first["children"] == {
                "convergence": {"state": "running", "restarts": 0, "last_error": None}
            }
            assert first["heartbeat_s"] == 15.0
            ctx.events.emit(published(7))
            ctx.events.emit(rejected(8, "projection", "unknown alias"))
            ctx.events.emit(published(9, generation=2))
            docs = [await next_doc(ws) for _ in range(3)]
            assert [(d["type"], d["revision"]) for d in docs] == [
                ("published", 7), ("rejected", 8), ("published", 9)]
            assert docs[1]["reason"] == "projection"
            assert [d["seq"] for d in docs] == [1, 2, 3]
            assert ctx.metrics.stream_clients._value.get() == 1


async def test_burst_beyond_buffer_closes_client_with_1013() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        settings = StreamSettings(max_buffer=8)
        async with running_admin(ctx, settings=settings) as srv, owned_ws(srv.host, srv.port) as ws:
            await ws.get_message()
            for i in range(20):
                ctx.events.emit(published(i))
            received = 0
            try:
                while True:
                    await ws.get_message()
                    received += 1
            except ConnectionClosed as exc:
                assert exc.reason is not None
                assert (exc.reason.code, exc.reason.reason) == (1013, "client too slow")
            assert received < 20
            assert counter_value(ctx.metrics.stream_dropped) == 1


async def test_client_that_never_reads_is_dropped_and_others_keep_receiving() -> None:
    with trio.fail_after(30):
        ctx = make_ctx()
        settings = StreamSettings(max_buffer=16, close_timeout_s=0.2, monitor_interval_s=0.05)
        async with running_admin(ctx, settings=settings) as srv:
            stuck = await raw_stream_client(srv.host, srv.port)
            async with open_websocket_url(srv.ws) as fast:
                await fast.get_message()
                pad = "x" * 16384
                i = 0
                # Publish in step with the reading client until the stuck one is
                # dropped: its socket fills, its buffer overflows, the hub resets it.
                while counter_value(ctx.metrics.stream_dropped) == 0:
                    before = trio.current_time()
                    ctx.events.emit(rejected(i, detail=pad))
                    assert trio.current_time() - before < 1.0  # publish never waits (it is sync)
                    doc = await next_doc(fast)
                    assert doc["revision"] == i
                    i += 1
                # The stuck client's connection is reset: reading now ends in EOF
                # or a reset after whatever was already buffered.
                try:
                    while await stuck.recv(65536):
                        pass
                except ConnectionResetError:
                    pass
                stuck.close()
                # The reading client is unaffected.
                for j in range(i, i + 5):
                    ctx.events.emit(published(j))
                    assert (await next_doc(fast))["revision"] == j
                assert counter_value(ctx.metrics.stream_dropped) == 1


async def test_hundred_clients_all_receive_a_publish() -> None:
    with trio.fail_after(30):
        ctx = make_ctx()
        clients = 100
        async with running_admin(ctx) as srv:
            ready = trio.Semaphore(0)
            go = trio.Event()
            got: list[int] = []

            async def one() -> None:
                async with open_websocket_url(srv.ws) as ws:
                    assert (await next_doc(ws))["type"] == "status"
                    ready.release()
                    await go.wait()
                    doc = await next_doc(ws)
                    assert doc["type"] == "published"
                    got.append(int(doc["revision"]))  # type: ignore[call-overload]

            async with trio.open_nursery() as nursery:
                for _ in range(clients):
                    nursery.start_soon(one)
                for _ in range(clients):
                    await ready.acquire()
                assert ctx.metrics.stream_clients._value.get() == clients
                ctx.events.emit(published(42))
                go.set()
            assert got == [42] * clients


async def test_shutdown_closes_clients_with_1001_even_with_a_stuck_peer() -> None:
    with trio.fail_after(30):
        ctx = make_ctx()
        # The monitor would reset the stuck peer on its own: make it wait longer
        # than the test, so shutdown alone has to deal with it.
        settings = StreamSettings(max_buffer=10_000, stall_timeout_s=600, close_timeout_s=600)
        async with running_admin(ctx, settings=settings, shutdown_timeout_s=1.0) as srv:
            stuck = await raw_stream_client(srv.host, srv.port)
            async with owned_ws(srv.host, srv.port) as ws:
                await ws.get_message()
                # Far more than loopback socket buffers hold (4 MiB send buffer at
                # most here, a few KiB on the receiving side): the stuck writer blocks.
                pad = "y" * 262144
                for i in range(64):
                    ctx.events.emit(rejected(i, detail=pad))
                    assert (await next_doc(ws))["revision"] == i
                start = trio.current_time()
                srv.stop()
                try:
                    await ws.get_message()
                    raise AssertionError("expected a close")
                except ConnectionClosed as exc:
                    assert exc.reason is not None
                    assert (exc.reason.code, exc.reason.reason) == (1001, "going away")
        # running_admin has waited for serve_admin: within its deadline, stuck peer or not.
        assert trio.current_time() - start < 2.0
        # The stuck peer could not take a close frame: its connection was reset.
        reset = False
        try:
            while await stuck.recv(1 << 20):
                pass
        except ConnectionResetError:
            reset = True
        stuck.close()
        assert reset
