"""The admin API over real HTTP: serve_admin on a free loopback port, httpx as client."""

from __future__ import annotations

import socket

import httpx
import msgspec
import pytest
import structlog
import trio
import trio.testing
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from supervisor.admin.errors import AdminBindError, AdminError
from supervisor.admin.server import serve_admin
from supervisor.errors import ConfigError, StartError
from tests.adminserver import make_ctx, owned_ws, running_admin
from tests.fakes.snapshot import FakeSnapshot, serve

TOKEN = "tok-123"


async def test_every_route() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        async with running_admin(ctx) as srv, httpx.AsyncClient(base_url=srv.base) as http:
            r = await http.get("/healthz")
            assert (r.status_code, r.json()) == (200, {"ok": True})
            r = await http.get("/readyz")
            assert r.status_code == 503
            assert r.json() == {"ready": False, "reason": "no snapshot published yet",
                                "consecutive_failures": 0}
            r = await http.get("/status")
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/json"
            assert set(r.json()) == {"revision", "children", "fanout", "leadership", "sinks", "version",
                                  "started_at", "threads_past_deadline"}
            assert r.json()["fanout"]["ServiceDefinition"]["objects"] == 12
            r = await http.get("/metrics")
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
            assert "supervisor_stream_clients 0.0" in r.text
            r = await http.get("/metrics", headers={"accept": "application/openmetrics-text"})
            assert r.headers["content-type"].startswith("application/openmetrics-text")
            assert r.text.endswith("# EOF\n")
            r = await http.get("/v1/snapshot")
            assert r.status_code == 503
            assert r.json()["error"] == "no_snapshot"
            r = await http.get("/nope")
            assert (r.status_code, r.json()["error"]) == (404, "not_found")
            r = await http.post("/status", content=b"{}")
            assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD")
            r = await http.request("PATCH", "/metrics")
            assert r.status_code == 405
            r = await http.head("/status")
            assert r.status_code == 200 and r.content == b""
            r = await http.get("/v1/stream")
            assert r.status_code == 426
            assert "server" not in r.headers


async def test_readyz_turns_ready_on_publish() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        async with running_admin(ctx) as srv, httpx.AsyncClient(base_url=srv.base) as http:
            ctx.revision.failed(None, "unavailable", "connection refused")
            r = await http.get("/readyz")
            assert r.status_code == 503
            assert "unavailable: connection refused" in r.json()["reason"]
            serve(ctx.state, FakeSnapshot(7, 3))
            r = await http.get("/readyz")
            assert (r.status_code, r.json()) == (200, {"ready": True, "revision": 7,
                                                       "generation": 3})


async def test_snapshot_etag_and_304() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        serve(ctx.state, FakeSnapshot(7, 3, keys={"team-a": {"sha256": "ab"}}))
        async with running_admin(ctx) as srv, httpx.AsyncClient(base_url=srv.base) as http:
            r = await http.get("/v1/snapshot")
            assert r.status_code == 200
            assert r.headers["etag"] == '"7-3"'
            assert r.json() == {"revision": 7, "generation": 3, "aliases": {},
                                "keys": {"team-a": {"sha256": "ab"}}}
            for header in ('"7-3"', 'W/"7-3"', '"1-1", "7-3"', "*"):
                r = await http.get("/v1/snapshot", headers={"if-none-match": header})
                assert r.status_code == 304, header
                assert r.content == b""
                assert r.headers["etag"] == '"7-3"'
            serve(ctx.state, FakeSnapshot(7, 4))
            r = await http.get("/v1/snapshot", headers={"if-none-match": '"7-3"'})
            assert r.status_code == 200
            assert r.headers["etag"] == '"7-4"'


async def test_token_guards_everything_but_healthz() -> None:
    with trio.fail_after(10):
        ctx = make_ctx(token=TOKEN)
        async with running_admin(ctx) as srv, httpx.AsyncClient(base_url=srv.base) as http:
            assert (await http.get("/healthz")).status_code == 200
            for path in ("/readyz", "/status", "/metrics", "/v1/snapshot", "/nope"):
                r = await http.get(path)
                assert r.status_code == 401, path
                assert r.headers["www-authenticate"].startswith("Bearer")
                assert r.json()["error"] == "unauthorized"
                r = await http.get(path, headers={"authorization": "Bearer wrong"})
                assert r.status_code == 401
            r = await http.get("/status", headers={"authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200
            with pytest.raises(ConnectionRejected) as info:
                async with owned_ws(srv.host, srv.port):
                    pass
            assert info.value.status_code == 401
            assert msgspec.json.decode(info.value.body or b"{}")["error"] == "unauthorized"
            with pytest.raises(ConnectionRejected):
                async with owned_ws(srv.host, srv.port, [(b"authorization", b"Bearer wrong")]):
                    pass
            headers = [(b"authorization", f"Bearer {TOKEN}".encode())]
            async with open_websocket_url(srv.ws, extra_headers=headers) as ws:
                assert msgspec.json.decode(await ws.get_message())["type"] == "status"


async def test_malformed_requests_do_not_hurt_the_server() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        async with running_admin(ctx) as srv:
            for raw in (
                b"GARBAGE\r\n\r\n",
                b"GET /status HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
                b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: \xff\xfe\r\n\r\n",
                b"BREW /status HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /v1/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\n\r\n",  # no key: a bad handshake
                b"GET /%ff%00 HTTP/1.1\r\nHost: x\r\n\r\n",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello
            ):
                stream = await trio.open_tcp_stream(srv.host, srv.port)
                await stream.send_all(raw)
                await stream.send_eof()
                reply = b""
                while chunk := await stream.receive_some(65536):
                    reply += chunk
                await stream.aclose()
                assert reply == b"" or reply.startswith(b"HTTP/1.1 "), (raw, reply)
            async with httpx.AsyncClient(base_url=srv.base) as http:
                assert (await http.get("/healthz")).status_code == 200


async def test_port_in_use_raises_admin_bind_error() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            async with trio.open_nursery() as nursery:
                with pytest.raises(AdminBindError) as info:
                    await nursery.start(serve_admin, ctx, f"127.0.0.1:{port}")
            error = info.value
            # Retryable (exit 1): not a configuration error, which no restart fixes.
            assert not isinstance(error, ConfigError) and isinstance(error, AdminError)
            assert isinstance(error, StartError)
            assert error.path == "$.admin.listen"
            assert error.reason == f"address 127.0.0.1:{port} already in use"
        # And the same port serves once it is free.
        async with running_admin(ctx, f"127.0.0.1:{port}") as srv:
            assert srv.port == port


async def test_bad_listen_values() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        with pytest.raises(ConfigError) as info:
            await serve_admin(ctx, "no-port")
        assert info.value.path == "$.admin.listen"
        with pytest.raises(AdminBindError) as bind:
            await serve_admin(ctx, "192.0.2.1:0")  # TEST-NET-1: not ours
        assert "is not an address of this host" in bind.value.reason


async def test_shutdown_is_prompt_with_idle_keepalive_connections() -> None:
    with trio.fail_after(10):
        ctx = make_ctx()
        async with httpx.AsyncClient() as http:
            async with running_admin(ctx, shutdown_timeout_s=5.0) as srv:
                r = await http.get(f"{srv.base}/healthz")  # the connection stays open
                assert r.status_code == 200
                start = trio.current_time()
                srv.stop()
            # Leaving running_admin waited for serve_admin to return.
            assert trio.current_time() - start < 1.0


async def test_shutdown_with_converge_requests_waiting_ends_without_an_error() -> None:
    """Requests waiting in POST /v1/converge when the server stops: their connections are
    closed under the task that waits for the client's disconnect, which is an end of the
    request, not an error of the server."""
    ctx = make_ctx()

    async def converge(timeout_s: float) -> None:
        await trio.sleep_forever()  # a loop that never answers before the stop

    ctx.converge = converge  # type: ignore[assignment]
    with trio.fail_after(20), structlog.testing.capture_logs() as logs:
        async with running_admin(ctx, shutdown_timeout_s=0.2) as srv:
            socks = []
            for _ in range(20):
                sock = trio.socket.socket()
                await sock.connect((srv.host, srv.port))
                await sock.send(b"POST /v1/converge HTTP/1.1\r\nHost: " + srv.host.encode()
                                + b"\r\nContent-Length: 0\r\n\r\n")
                socks.append(sock)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            srv.stop()
        # Leaving running_admin re-raised whatever serve_admin raised: nothing.
        for sock in socks:
            sock.close()
    assert [e for e in logs if e["event"] == "admin connection failed"] == []


async def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    with trio.fail_after(10):
        try:
            async with running_admin(make_ctx(), "[::1]:0") as srv:
                assert srv.host == "::1"
                async with httpx.AsyncClient() as http:
                    r = await http.get(f"http://[::1]:{srv.port}/healthz")
                    assert r.status_code == 200
        except AdminBindError as exc:
            pytest.skip(f"no IPv6 loopback here: {exc}")


async def test_real_snapshot_is_served() -> None:
    snapshot_mod = pytest.importorskip("supervisor.revision.snapshot")
    document = pytest.importorskip("supervisor.revision.document")
    with trio.fail_after(10):
        ctx = make_ctx()
        snapshot = snapshot_mod.Snapshot(
            revision=7, generation=3,
            aliases={"chat": document.AliasSpec(upstream="https://llm.internal:8443/v1")},
            keys={"team-a": snapshot_mod.KeyEntry("ab" * 32, ("chat",))},
        )
        serve(ctx.state, snapshot)
        async with running_admin(ctx) as srv, httpx.AsyncClient(base_url=srv.base) as http:
            r = await http.get("/v1/snapshot")
            assert r.status_code == 200
            assert r.headers["etag"] == '"7-3"'
            assert r.content == snapshot.to_json()
            assert r.json()["keys"]["team-a"]["digest"] == "ab" * 32
            r = await http.get("/v1/snapshot", headers={"if-none-match": r.headers["etag"]})
            assert r.status_code == 304
            assert (await http.get("/readyz")).json() == {
                "ready": True, "revision": 7, "generation": 3}


async def _exchange(host: str, port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream(host, port)
    try:
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            pass  # answered and closed before all of it was in
        reply = b""
        try:
            while chunk := await stream.receive_some(65536):
                reply += chunk
        except trio.BrokenResourceError:
            pass
        return reply
    finally:
        await stream.aclose()


async def test_oversized_heads_and_bodies_are_refused_and_end_their_connection() -> None:
    with trio.fail_after(10):
        async with running_admin(make_ctx()) as srv:
            head = (b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (20 * 1024)
                    + b"\r\n\r\n")
            assert (await _exchange(srv.host, srv.port, head)).startswith(b"HTTP/1.1 431")
            body = b"x" * (65 * 1024)
            post = (b"POST /v1/converge HTTP/1.1\r\nHost: x\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\n\r\n" + body)
            assert (await _exchange(srv.host, srv.port, post)).startswith(b"HTTP/1.1 413")
            async with httpx.AsyncClient(base_url=srv.base) as http:
                assert (await http.get("/healthz")).status_code == 200


async def test_a_client_message_over_64_kib_closes_the_stream_with_1009() -> None:
    with trio.fail_after(10):
        async with running_admin(make_ctx()) as srv, owned_ws(srv.host, srv.port) as ws:
            await ws.get_message()  # the status
            await ws.send_message("x" * (64 * 1024 + 1))
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    await ws.get_message()
            assert info.value.reason is not None and info.value.reason.code == 1009


async def _answers_until_closed(host: str, port: int, data: bytes) -> tuple[bytes, bool]:
    """What the server sends for ``data`` (our side left open), and whether it closed
    the connection within two seconds."""
    stream = await trio.open_tcp_stream(host, port)
    reply = b""
    closed = False
    try:
        await stream.send_all(data)
        with trio.move_on_after(2):
            try:
                while chunk := await stream.receive_some(65536):
                    reply += chunk
            except trio.BrokenResourceError:
                pass
            closed = True
    finally:
        await stream.aclose()
    return reply, closed


async def test_content_length_beside_transfer_encoding_is_refused_and_ends_the_connection(
) -> None:
    # Both framings in one request is the shape of request smuggling: a proxy in
    # front that honours Content-Length sees the pipelined GET as body bytes.
    smuggle = (b"POST /v1/converge HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
               b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    with trio.fail_after(10):
        async with running_admin(make_ctx()) as srv:
            reply, closed = await _answers_until_closed(srv.host, srv.port, smuggle)
            assert reply.startswith(b"HTTP/1.1 400"), reply
            assert reply.count(b"HTTP/1.1 ") == 1, reply  # the GET was never served
            assert closed
            async with httpx.AsyncClient(base_url=srv.base) as http:
                assert (await http.get("/healthz")).status_code == 200
