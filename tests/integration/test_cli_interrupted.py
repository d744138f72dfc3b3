"""Ctrl-C ends a command that has not got its answer with exit 1 (and, with
``--json``, the failure document): a health check or a ``publish --wait`` that
was interrupted did not succeed. ``watch`` is stopped that way on purpose: 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.proc import EXAMPLE, REPO, write_config


async def _interrupted(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the command against a replica that accepts and never answers; SIGINT it
    once its request has arrived."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    words = [w.replace("PORT", str(port)) for w in args]
    held: list[trio.SocketStream] = []
    with trio.fail_after(30):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "supervisor", *words], cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        held.append(await listener.accept())  # the request is in flight
        process.send_signal(signal.SIGINT)
        await process.wait()
        assert process.stdout is not None and process.stderr is not None
        out = await process.stdout.receive_some(65536) or b""
        err = await process.stderr.receive_some(65536) or b""
    for stream in held:
        await stream.aclose()
    await listener.aclose()
    return subprocess.CompletedProcess(words, process.returncode, out, err)


@pytest.mark.parametrize("command", [
    ("status", "--url", "http://127.0.0.1:PORT", "--check"),
    ("status", "--url", "http://127.0.0.1:PORT", "--url", "http://127.0.0.1:PORT"),
])
async def test_an_interrupted_status_is_not_healthy(command: tuple[str, ...]) -> None:
    result = await _interrupted(*command)
    assert result.returncode == 1, result.stderr
    assert b"interrupted" in result.stderr
    assert b"Traceback" not in result.stderr


async def test_an_interrupted_json_command_prints_its_failure_document() -> None:
    result = await _interrupted("status", "--json", "--url", "http://127.0.0.1:PORT")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc == {"ok": False, "reason": "unavailable", "detail": "interrupted"}


async def test_an_interrupted_publish_wait_did_not_converge(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    result = await _interrupted("publish", "--config", str(config), str(EXAMPLE), "--wait",
                                "--url", "http://127.0.0.1:PORT", "--json")
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["ok"] is False


async def test_watch_stopped_with_ctrl_c_exits_0() -> None:
    result = await _interrupted("watch", "--url", "ws://127.0.0.1:PORT/v1/stream")
    assert result.returncode == 0, result.stderr
    assert b"Traceback" not in result.stderr
