"""``trio-supervisor watch`` against a replica that requires the admin token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio

from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config

TOKEN = "watch-token-0123456789abcdef"


async def test_watch_takes_the_token_from_token_file(tmp_path: Path) -> None:
    token = tmp_path / "admin.token"
    token.write_text(TOKEN)
    os.chmod(token, 0o600)
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", f'token_file = "{token}"',
                          port=port)
    await acli("publish", "--config", str(config), str(EXAMPLE))
    url = f"ws://127.0.0.1:{port}/v1/stream"
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            denied = await acli("watch", "--url", url, "--no-reconnect", check=False)
            assert denied.returncode == 1 and "401" in denied.stderr, denied.stderr
            script = str(Path(sys.executable).parent / "trio-supervisor")
            watcher = await trio.lowlevel.open_process(
                [script, "watch", "--url", url, "--token-file", str(token), "--no-reconnect"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                assert watcher.stdout is not None
                seen = b""
                while b"\n" not in seen:
                    chunk = await watcher.stdout.receive_some()
                    assert chunk, seen
                    seen += chunk
                first = json.loads(seen.split(b"\n", 1)[0])
                assert first["type"] == "status" and first["revision"]["active"] == 1
            finally:
                watcher.kill()
                await watcher.wait()
