"""fetch_status and watch_stream against a real server."""

from __future__ import annotations

import io
import json
import random

import pytest
import trio

from supervisor.admin.client import fetch_status, watch_stream
from supervisor.admin.errors import AdminRefused, AdminUnreachable
from supervisor.admin.status_view import render_status
from supervisor.status_doc import ChildReport
from tests.adminserver import make_ctx, published, rejected, running_admin
from tests.proc import free_port


class Lines(io.StringIO):
    """A TextIO whose writes can be awaited, line by line."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = trio.Event()

    def write(self, s: str) -> int:
        n = super().write(s)
        self.changed.set()
        self.changed = trio.Event()
        return n

    def docs(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.getvalue().splitlines()]

    async def wait_for(self, count: int) -> list[dict[str, object]]:
        while len(self.getvalue().splitlines()) < count:
            await self.changed.wait()
        return self.docs()


async def test_fetch_status_and_render() -> None:
    with trio.fail_after(10):
        ctx = make_ctx(token="tok")
        ctx.revision.observed(7)
        async with running_admin(ctx) as srv:
            doc = await fetch_status(srv.base, "tok")
            assert doc["revision"]["desired"] == 7
            assert doc["children"]["convergence"]["state"] == "running"
            text = render_status(doc)
            assert "desired 7" in text and "convergence" in text and "ServiceDefinition" in text
            # Without the scheme, and with a trailing slash, too.
            assert (await fetch_status(f"{srv.host}:{srv.port}/", "tok"))["revision"]
            with pytest.raises(AdminRefused) as refused:
                await fetch_status(srv.base, "wrong")
            assert refused.value.status_code == 401
            assert isinstance(refused.value, AdminUnreachable)
            assert "wrong" not in str(refused.value)


async def test_fetch_status_unreachable() -> None:
    with trio.fail_after(10):
        port = free_port()
        with pytest.raises(AdminUnreachable) as info:
            await fetch_status(f"http://127.0.0.1:{port}", timeout_s=2.0)
        assert info.value.status_code is None
        assert f"127.0.0.1:{port}/status" in str(info.value)


async def test_fetch_status_times_out() -> None:
    with trio.fail_after(10):
        # A listener that accepts (via the backlog) and never answers.
        listener = trio.socket.socket()
        await listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with pytest.raises(AdminUnreachable) as info:
            await fetch_status(f"http://127.0.0.1:{port}", timeout_s=0.3)
        listener.close()
        assert "0.3" in str(info.value) or "Timeout" in str(info.value)


async def test_fetch_status_non_200() -> None:
    with trio.fail_after(10):
        def broken() -> dict[str, ChildReport]:
            raise RuntimeError("boom")

        async with running_admin(make_ctx(children=broken)) as srv:
            with pytest.raises(AdminUnreachable) as info:
                await fetch_status(srv.base)
            assert info.value.status_code == 500
            assert "answered 500" in str(info.value)


async def test_watch_prints_events_and_returns_on_close() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        out = Lines()
        async with running_admin(ctx) as srv, trio.open_nursery() as nursery:
            done = trio.Event()

            async def watch() -> None:
                await watch_stream(srv.ws, out, reconnect=False)
                done.set()

            nursery.start_soon(watch)
            await out.wait_for(1)
            ctx.events.emit(published(7))
            ctx.events.emit(rejected(8, "secret"))
            docs = await out.wait_for(3)
            assert [d["type"] for d in docs] == ["status", "published", "rejected"]
            assert out.getvalue().count("\n") == 3
            srv.stop()  # the server closes with 1001: a clean close
            await done.wait()


async def test_watch_max_events_and_token() -> None:
    with trio.fail_after(10):
        ctx = make_ctx(token="tok")
        out = Lines()
        async with running_admin(ctx) as srv:
            with pytest.raises(AdminRefused):
                await watch_stream(srv.ws, out, token="nope")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: watch_stream(srv.base, out, token="tok", max_events=2))
                await out.wait_for(1)
                ctx.events.emit(published(1))
            assert [d["type"] for d in out.docs()] == ["status", "published"]


async def test_watch_without_reconnect_raises_when_unreachable() -> None:
    with trio.fail_after(10):
        with pytest.raises(AdminUnreachable):
            await watch_stream(f"ws://127.0.0.1:{free_port()}/v1/stream", io.StringIO(),
                               reconnect=False)


async def test_watch_reconnects_after_a_server_restart() -> None:
    with trio.fail_after(20):
        ctx = make_ctx()
        out = Lines()
        port = free_port()
        listen = f"127.0.0.1:{port}"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: watch_stream(
                f"ws://{listen}/v1/stream", out, max_events=4,
                backoff_initial_s=0.05, backoff_max_s=0.2, rng=random.Random(1),
            ))
            async with running_admin(ctx, listen) as srv:
                await out.wait_for(1)
                ctx.events.emit(published(1))
                await out.wait_for(2)
                srv.stop()
            # Down for a moment; the watcher retries with backoff until it is back.
            async with running_admin(ctx, listen):
                await out.wait_for(3)  # a fresh status line first
                ctx.events.emit(published(2))
                docs = await out.wait_for(4)
        assert [(d["type"], d.get("revision")) for d in docs][1::2] == [
            ("published", 1), ("published", 2)]
        assert docs[2]["type"] == "status"


async def test_fetch_status_stops_reading_an_endless_body() -> None:
    """A port that answers 200 and never stops sending is refused once the body passes
    the bound, not read into memory for as long as the timeout allows (GBs)."""
    from supervisor.admin.client import MAX_STATUS_BYTES

    sent = 0

    async def endless(stream: trio.SocketStream) -> None:
        nonlocal sent
        await stream.receive_some(65536)
        chunk = b"1," * 32768
        try:
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
            while True:
                await stream.send_all(chunk)
                sent += len(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, endless, 0)
            port = listeners[0].socket.getsockname()[1]
            with pytest.raises(AdminUnreachable) as info:
                await fetch_status(f"http://127.0.0.1:{port}", timeout_s=25.0)
            nursery.cancel_scope.cancel()
    assert f"more than {MAX_STATUS_BYTES // 2**20} MiB" in str(info.value)
    assert sent < 4 * MAX_STATUS_BYTES


async def test_watch_prints_no_control_character_a_server_sends() -> None:
    """Whatever answers on the port may send a text message that is not JSON: its ANSI
    escapes and BEL never reach the terminal (the JSON of a real server has none raw)."""
    from trio_websocket import WebSocketRequest, serve_websocket

    async def hostile(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.send_message("\x1b]0;pwned\x07\x1b[2Jnot json")
        await ws.send_message('{"type": "status", "note": "fine"}')
        await ws.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve_websocket, hostile, "127.0.0.1", 0, None)
            out = Lines()
            await watch_stream(f"ws://127.0.0.1:{server.port}/v1/stream", out,
                               reconnect=False)
            nursery.cancel_scope.cancel()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "not json" in lines[0]
    assert not [c for c in out.getvalue() if not c.isprintable() and c != "\n"], lines
