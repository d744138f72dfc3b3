"""The admin API of the real daemon: the `status` and `watch` commands, port in use."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import trio

from tests.proc import EXAMPLE, REPO, acli, cli, free_port, run_daemon, write_config


async def test_status_and_watch_commands_against_a_real_daemon(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port)
    cli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            status = await acli("status", "--config", str(config))
            assert "control_plane" in status.stdout and "convergence" in status.stdout
            raw = json.loads((await acli("status", "--config", str(config), "--json")).stdout)
            assert raw["revision"]["active"] == 1
            assert raw["children"]["convergence"]["state"] == "running"
            assert set(raw) == {"revision", "children", "fanout", "leadership", "sinks", "version",
                                  "started_at", "threads_past_deadline"}
            assert raw["leadership"] == {"role": "disabled", "holder": None, "lease": None}
            assert raw["fanout"]["ServiceDefinition"] == {
                "state": "disabled", "last_error_class": None, "objects": 0}
            assert raw["fanout"]["Workflow"]["state"] == "disabled"
            async with httpx.AsyncClient() as client:
                metrics = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            assert 'supervisor_child_restarts_total{child="convergence"} 0.0' in metrics
            assert 'supervisor_revision_rejections_total{reason="projection"} 0.0' in metrics
            assert "supervisor_active_revision 1.0" in metrics
            assert "process_resident_memory_bytes" in metrics

            watcher = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "watch", "--url",
                 f"ws://127.0.0.1:{port}/v1/stream"],
                stdout=subprocess.PIPE, cwd=str(REPO),
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            try:
                assert watcher.stdout is not None
                buffer = b""
                lines: list[dict[str, object]] = []

                async def next_event() -> dict[str, object]:
                    nonlocal buffer
                    while b"\n" not in buffer:
                        chunk = await watcher.stdout.receive_some()  # type: ignore[union-attr]
                        assert chunk, "watch exited"
                        buffer += chunk
                    line, buffer = buffer.split(b"\n", 1)
                    event = json.loads(line)
                    lines.append(event)
                    return event

                first = await next_event()
                assert first["type"] == "status"  # the current state comes first
                await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
                while True:
                    event = await next_event()
                    if event["type"] == "published":
                        break
                assert event["revision"] == 2
            finally:
                watcher.kill()
                await watcher.wait()
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def test_status_of_an_unreachable_daemon_exits_1(tmp_path: Path) -> None:
    result = await acli("status", "--url", f"http://127.0.0.1:{free_port()}", check=False)
    assert result.returncode == 1
    assert "status:" in result.stderr


async def test_port_in_use_exits_1_naming_the_address(tmp_path: Path) -> None:
    """A bind failure is retryable (exit 1, restarted by systemd), not a configuration error."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port)
        cli("publish", "--config", str(config), str(EXAMPLE), "--force")
        result = await acli("run", "--config", str(config), check=False)
    assert result.returncode == 1, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert "already in use" in result.stderr
    [line] = [json.loads(x) for x in result.stderr.splitlines() if "cannot start" in x]
    assert line["level"] == "critical" and line["address"] == f"127.0.0.1:{port}"
    assert "already in use" in line["error"]
    # Only JSON lines on stderr: nothing printed beside the log.
    assert all(x.startswith("{") for x in result.stderr.splitlines() if x.strip())


async def test_token_protects_every_route_but_healthz(tmp_path: Path) -> None:
    port = free_port()
    token = tmp_path / "admin.token"
    token.write_text("s3cret-token\n")
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                          f'token_file = "{token}"\n', port=port)
    # write_config appends extra after [admin]'s listen line: token_file lands in [admin].
    cli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                assert (await client.get("/healthz")).status_code == 200
                assert (await client.get("/status")).status_code == 401
                ok = await client.get("/v1/snapshot",
                                      headers={"Authorization": "Bearer s3cret-token"})
                assert ok.status_code == 200 and ok.json()["revision"] == 1
            status = await acli("status", "--config", str(config), "--json")
            assert json.loads(status.stdout)["revision"]["active"] == 1
            url = f"http://127.0.0.1:{port}"
            by_file = await acli("status", "--url", url, "--token-file", str(token))
            assert "active 1" in by_file.stdout and "control plane up yes" in by_file.stdout
            refused = await acli("status", "--url", url, check=False)
            assert refused.returncode == 1 and "401" in refused.stderr
            missing = await acli("status", "--url", url, "--token-file",
                                 str(tmp_path / "nope"), check=False)
            assert missing.returncode == 2 and "--token-file" in missing.stderr
            assert "s3cret-token" not in "\n".join(daemon.raw)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def test_watch_without_reconnect_exits_0_when_the_daemon_stops(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port)
    cli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            watcher = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "watch", "--no-reconnect", "--url",
                 f"ws://127.0.0.1:{port}/v1/stream"],
                stdout=subprocess.PIPE, cwd=str(REPO),
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            assert watcher.stdout is not None
            first = await watcher.stdout.receive_some()
            assert b'"type":"status"' in first.replace(b" ", b"")
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
            assert await watcher.wait() == 0  # the daemon closed the stream cleanly (1001)
    unreachable = await acli("watch", "--no-reconnect", "--url",
                             f"ws://127.0.0.1:{free_port()}/v1/stream", check=False)
    assert unreachable.returncode == 1


class _StaticStatus(http.server.BaseHTTPRequestHandler):
    doc: ClassVar[dict[str, object]] = {}

    def do_GET(self) -> None:
        body = json.dumps(self.doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(("doc", "problem"), [
    ({"revision": {"active": None}, "children": {"convergence": {"state": "running"}}},
     "not ready"),
    ({"revision": {"active": 3}, "children": {"listen": {"state": "failed"}}},
     "child listen has failed"),
    ({"revision": {"active": 3}, "children": {"listen": {"state": "running"}}}, None),
])
async def test_status_exits_1_when_the_replica_is_not_healthy(
        doc: dict[str, object], problem: str | None) -> None:
    handler = type("Handler", (_StaticStatus,), {"doc": doc})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with trio.fail_after(30):
            result = await acli("status", "--url", f"http://127.0.0.1:{server.server_port}",
                                check=False)
    finally:
        server.shutdown()
        server.server_close()
    if problem is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 1 and problem in result.stderr
        assert "revision" in result.stdout  # the report is still printed


@pytest.mark.parametrize(("content", "fragment"), [
    ("\n", "is empty"),
    ("s3cret-token\n", "same token as admin.token_file"),
])
async def test_check_refuses_a_read_token_file_start_would_refuse(
        tmp_path: Path, content: str, fragment: str) -> None:
    # The read token equal to the full one would let its holder POST /v1/converge.
    token = tmp_path / "admin.token"
    token.write_text("s3cret-token\n")
    read = tmp_path / "read.token"
    read.write_text(content)
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                          f'token_file = "{token}"\nread_token_file = "{read}"\n')
    checked = cli("check", "--config", str(config), check=False)
    assert checked.returncode == 2, checked.stdout
    assert "$.admin.read_token_file" in checked.stderr and fragment in checked.stderr
    cli("publish", "--config", str(config), str(EXAMPLE))
    ran = cli("run", "--config", str(config), check=False, timeout=30)
    assert ran.returncode == 2
    assert "$.admin.read_token_file" in ran.stderr and fragment in ran.stderr
    assert "s3cret-token" not in ran.stderr + checked.stderr
