"""The admin server's TLS transport: serve_admin with a server context, certificates from trustme."""

from __future__ import annotations

import io
import ssl
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import trio
from trio_websocket import open_websocket_url

from supervisor.admin.client import fetch_status, watch_stream
from supervisor.admin.errors import AdminUnreachable
from supervisor.admin.limits import derive
from supervisor.commands.waiting import wait_for_revision
from supervisor.tlsconfig import server_context
from tests.adminserver import make_ctx, published, running_admin
from tests.fakes.snapshot import FakeSnapshot, serve
from tests.floods import until_closed

trustme = pytest.importorskip("trustme")

IDLE_DEADLINE_S = 5.0  # supervisor.admin.server.IDLE_DEADLINE_S


@pytest.fixture
def pki(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting its CA)."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    for blob in leaf.cert_chain_pems:
        blob.write_to_path(str(cert), append=cert.exists())
    leaf.private_key_pem.write_to_path(str(key))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server_context(str(cert), str(key)), client


async def test_https_and_wss_serve_the_routes_over_http11_only(
    pki: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server, client = pki
    with trio.fail_after(20):
        ctx = make_ctx()
        async with running_admin(ctx, tls=lambda: server) as srv:
            base = f"https://127.0.0.1:{srv.port}"
            async with httpx.AsyncClient(verify=client, trust_env=False, base_url=base) as http:
                assert (await http.get("/healthz")).json() == {"ok": True}
                r = await http.get("/status")
                assert r.status_code == 200 and r.http_version == "HTTP/1.1"
            # A client offering h2 first is answered with http/1.1 (ALPN).
            offer = client
            offer.set_alpn_protocols(["h2", "http/1.1"])
            stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", srv.port,
                                                         ssl_context=offer)
            await stream.do_handshake()
            assert stream.selected_alpn_protocol() == "http/1.1"
            await stream.aclose()
            async with open_websocket_url(f"wss://127.0.0.1:{srv.port}/v1/stream",
                                          ssl_context=client) as ws:
                first = msgspec.json.decode(await ws.get_message())
                assert first["type"] == "status"
                ctx.events.emit(published(3))
                assert msgspec.json.decode(await ws.get_message())["revision"] == 3
            srv.stop()


async def test_status_watch_and_publish_wait_name_a_certificate_from_an_untrusted_ca(
    pki: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    # The TLS refusal is at the end of httpx's and trio's exception chains (their own
    # text is empty) and never reaches trio-websocket's caller (it only times out):
    # each client names it, with where the CA is given.
    server, trusting = pki
    untrusting = ssl.create_default_context()
    trustme.CA().configure_trust(untrusting)  # another CA than the one that signed it
    refused = "TLS: CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"
    with trio.fail_after(30):
        ctx = make_ctx()
        serve(ctx.state, FakeSnapshot(1, 1))
        async with running_admin(ctx, tls=lambda: server) as srv:
            base = f"https://127.0.0.1:{srv.port}"
            with pytest.raises(AdminUnreachable) as status:
                await fetch_status(base, ssl_context=untrusting)
            with pytest.raises(AdminUnreachable) as watched:
                await watch_stream(base, io.StringIO(), reconnect=False, ssl_context=untrusting)
            waited = await wait_for_revision(base, 1, None, 2.0, ssl_context=untrusting)
            assert waited.state == "timeout" and waited.detail is not None
            for text in (str(status.value), str(watched.value), waited.detail):
                assert refused in text and "(the replica's CA: --ca-file)" in text, text
            assert "cannot connect" in str(watched.value)
            # With the CA, the same connection serves both stream clients.
            assert (await wait_for_revision(base, 1, None, 10.0, ssl_context=trusting)
                    ).state == "active"
            out = io.StringIO()
            await watch_stream(base, out, max_events=1, ssl_context=trusting)
            assert '"type":"status"' in out.getvalue()
            srv.stop()


async def test_a_handshake_never_started_is_closed_at_the_head_deadline(
    pki: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server, _ = pki
    with trio.fail_after(20):
        async with running_admin(make_ctx(), tls=lambda: server) as srv:
            silent = await trio.open_tcp_stream("127.0.0.1", srv.port)
            started = time.monotonic()
            await until_closed(silent)
            assert time.monotonic() - started < IDLE_DEADLINE_S + 1.5
            await silent.aclose()
            srv.stop()


async def test_healthz_over_tls_is_answered_when_idle_connections_fill_the_limit(
    pki: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server, client = pki
    limits = derive(80, None)  # 16 connections
    assert limits.max_connections == 16
    with trio.fail_after(20):
        async with running_admin(make_ctx(), tls=lambda: server, limits=limits) as srv:
            idle = [await trio.open_tcp_stream("127.0.0.1", srv.port) for _ in range(32)]
            async with httpx.AsyncClient(verify=client, trust_env=False) as http:
                r = await http.get(f"https://127.0.0.1:{srv.port}/healthz")
                assert r.status_code == 200
            for stream in idle:
                await stream.aclose()
            srv.stop()


def test_the_server_context_refuses_renegotiation_whatever_openssl_defaults_to(
    pki: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    # A client renegotiating over and over costs the server a handshake each time;
    # OpenSSL before 3.0 accepts a client's renegotiation unless told not to.
    server, _ = pki
    assert server.options & ssl.OP_NO_RENEGOTIATION
    assert server.minimum_version >= ssl.TLSVersion.TLSv1_2
