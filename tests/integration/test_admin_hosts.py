"""Host and Origin checks of the real daemon: DNS rebinding and
cross-site WebSockets get nothing, while curl, `status` and `watch` keep working."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.admin.hosts import LOOPBACK_NAMES, AllowedHosts, host_of, origin_of
from tests.floods import connect, read_head, request, websocket_request
from tests.proc import EXAMPLE, REPO, acli, cli, free_port, run_daemon, write_config


def test_allowed_hosts() -> None:
    loopback = AllowedHosts("127.0.0.1", ["supervisor.internal", ".svc.cluster.local"])
    for host in ("127.0.0.1", "localhost", "::1", "supervisor.internal",
                 "admin.ns.svc.cluster.local", "svc.cluster.local"):
        assert loopback.allows(host), host
    for host in ("evil.example", "127.0.0.2", "supervisor.internal.evil.example", ""):
        assert not loopback.allows(host), host
    assert host_of("LocalHost.:9464") == "localhost" and host_of("[::1]:80") == "::1"
    # Anything after the bracket but a port is not that address.
    assert not loopback.allows_host_header("[::1]evil.example")
    assert not loopback.allows_host_header("[::1]:80x")
    assert not loopback.allows_host_header("[::1")
    assert loopback.allows_host_header(None)  # HTTP/1.0: no browser
    assert loopback.allows_origin(None) and loopback.allows_origin("http://localhost:9464")
    assert not loopback.allows_origin("null")
    assert not loopback.allows_origin("http://evil.example")
    public = AllowedHosts("10.0.0.5")
    assert public.allows("10.0.0.5") and not public.allows("localhost")
    assert not public.allows("10.0.0.6")
    wildcard = AllowedHosts("0.0.0.0", [".svc.cluster.local"])
    assert wildcard.allows("10.1.2.3") and wildcard.allows("localhost")  # pod IPs, probes
    assert wildcard.allows("admin.ns.svc.cluster.local") and not wildcard.allows("evil.example")
    assert AllowedHosts("0.0.0.0", ["*"]).allows("anything.example")


def test_an_origin_is_allowed_only_with_the_listeners_scheme_and_port() -> None:
    hosts = AllowedHosts("127.0.0.1", port=9464, origins=["https://console.example:8443"])
    for origin in ("http://localhost:9464", "http://127.0.0.1:9464", "http://[::1]:9464",
                   "HTTP://LocalHost.:9464", "https://console.example:8443"):
        assert hosts.allows_origin(origin), origin
    for origin in ("http://localhost:8080", "https://127.0.0.1:1", "http://[::1]:3000",
                   "https://localhost:9464", "http://localhost", "http://evil.example:9464",
                   "https://console.example", "http://console.example:8443",
                   "http://localhost:9464/path", "ws://localhost:9464", "null",
                   "http://localhost:99999"):
        assert not hosts.allows_origin(origin), origin
    tls = AllowedHosts("127.0.0.1", port=443, scheme="https")
    assert tls.allows_origin("https://localhost") and not tls.allows_origin("http://localhost:443")


async def test_unknown_host_gets_421_and_a_foreign_origin_403(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                          'allowed_hosts = ["supervisor.internal"]\n', port=port)
    cli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            status, body, _ = await request(port, "/v1/snapshot", host="evil.example")
            assert status == 421 and b"misdirected_request" in body
            assert (await request(port, "/status", host="evil.example:9464"))[0] == 421
            assert (await request(port, "/healthz", host="evil.example"))[0] == 200  # probes
            for host in (f"127.0.0.1:{port}", "localhost", "supervisor.internal:80"):
                assert (await request(port, "/v1/snapshot", host=host))[0] == 200, host

            async def handshake(**kwargs: str) -> bytes:
                stream = await connect(port)
                try:
                    await stream.send_all(websocket_request(**kwargs))
                    return await read_head(stream)
                finally:
                    await stream.aclose()

            assert (await handshake(origin="http://evil.example")).startswith(b"HTTP/1.1 403")
            assert (await handshake(origin="null")).startswith(b"HTTP/1.1 403")
            assert (await handshake(host="evil.example")).startswith(b"HTTP/1.1 421")
            assert (await handshake(origin=f"http://localhost:{port}")).startswith(
                b"HTTP/1.1 101")
            assert (await handshake()).startswith(b"HTTP/1.1 101")  # no Origin: not a browser

            # The operator's tools, unchanged.
            status_doc = json.loads((await acli("status", "--config", str(config),
                                                "--json")).stdout)
            assert status_doc["revision"]["active"] == 1
            curl = shutil.which("curl")
            if curl is not None:
                result = await trio.run_process([curl, "-sf", f"http://localhost:{port}/status"],
                                                capture_stdout=True)
                assert json.loads(result.stdout)["revision"]["active"] == 1
            watcher = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "watch", "--no-reconnect", "--url",
                 f"ws://127.0.0.1:{port}/v1/stream"],
                stdout=subprocess.PIPE, cwd=str(REPO), env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            assert watcher.stdout is not None
            first = await watcher.stdout.receive_some()
            assert b'"type":"status"' in first.replace(b" ", b"")
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
            assert await watcher.wait() == 0


async def test_converge_post_is_held_to_the_host_and_origin_checks(tmp_path: Path) -> None:
    """POST /v1/converge runs an attempt: a rebound name (foreign Host) or a cross-site
    page (foreign Origin; a simple POST needs no CORS preflight) must not start one."""
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port)
    cli("publish", "--config", str(config), str(EXAMPLE), "--force")
    path = "/v1/converge?timeout_s=10"
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            status, body, _ = await request(port, path, method="POST", host="evil.example")
            assert status == 421 and b"misdirected_request" in body, body
            status, body, _ = await request(port, path, method="POST",
                                            headers="Origin: http://evil.example\r\n")
            assert status == 403 and b"forbidden_origin" in body, body
            status, body, _ = await request(port, path, method="POST", headers="Origin: null\r\n")
            assert status == 403, body
            # The operator's own calls: no Origin (curl, publish --wait), or a known one.
            for headers in ("", f"Origin: http://localhost:{port}\r\n"):
                status, body, _ = await request(port, path, method="POST", headers=headers)
                assert status == 200, body
                assert json.loads(body.split(b"\r\n\r\n", 1)[1])["outcome"] == "converged"
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


CROSS_ORIGINS = ("http://localhost:8080", "https://127.0.0.1:1", "http://[::1]:3000")


async def test_a_page_on_another_port_of_localhost_is_another_origin(tmp_path: Path) -> None:
    """Any program serving a page on localhost (another port, another scheme) must
    neither start a convergence attempt nor read the stream of a token-less replica."""
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                          'allowed_origins = ["https://console.example:8443"]\n', port=port)
    cli("publish", "--config", str(config), str(EXAMPLE))
    path = "/v1/converge?timeout_s=10"

    async def handshake(origin: str) -> bytes:
        stream = await connect(port)
        try:
            await stream.send_all(websocket_request(origin=origin))
            return await read_head(stream)
        finally:
            await stream.aclose()

    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            for origin in CROSS_ORIGINS:
                status, body, _ = await request(port, path, method="POST",
                                                headers=f"Origin: {origin}\r\n")
                assert status == 403 and b"forbidden_origin" in body, (origin, body)
                assert (await handshake(origin)).startswith(b"HTTP/1.1 403"), origin
            own = (f"http://localhost:{port}", f"http://127.0.0.1:{port}",
                   f"http://[::1]:{port}", "https://console.example:8443")
            for origin in own:
                status, body, _ = await request(port, path, method="POST",
                                                headers=f"Origin: {origin}\r\n")
                assert status == 200, (origin, body)
                assert (await handshake(origin)).startswith(b"HTTP/1.1 101"), origin
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


_HOST_PIECES = st.lists(st.sampled_from([
    "localhost", "LocalHost", "127.0.0.1", "::1", "[", "]", ":", "9464", "80x", ".", "evil",
    "example", "http", "https", "://", "/", "?", "#", "@", "user", "%", "\x00", "\x1b", "\xff",
    " ", "\t", "null", "99999", "-1"]), max_size=10).map("".join)
_HEADER_TEXT = _HOST_PIECES | st.binary(max_size=100).map(lambda b: b.decode("latin-1"))


@settings(max_examples=200, deadline=None)
@given(_HEADER_TEXT)
def test_any_host_or_origin_header_is_judged_without_raising(value: str) -> None:
    # A loopback listener knows its loopback names only: anything else it lets in is a bug.
    hosts = AllowedHosts("127.0.0.1", port=9464)
    if hosts.allows_host_header(value):
        assert host_of(value) in LOOPBACK_NAMES
    origin = origin_of(value)
    if origin is not None:
        scheme, host, port = origin
        assert scheme in ("http", "https") and host and 0 <= port <= 65535
    if hosts.allows_origin(value):
        assert origin is not None and origin[0] == "http" and origin[2] == 9464
        assert origin[1] in LOOPBACK_NAMES
