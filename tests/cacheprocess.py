"""The daemon with a signed cache configured: its config, its keys, one serve-and-stop."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio

from tests.proc import cli, run_daemon, write_config


def keys(tmp_path: Path, name: str = "signing.key") -> tuple[Path, str]:
    key = tmp_path / name
    out = cli("keygen", "--out", str(key))
    return key, out.stdout.strip().splitlines()[-1].split()[-1]


def cache_config(tmp_path: Path, url: str, key: Path, trusted: list[str], *,
                 admin_port: int | None = None) -> Path:
    extra = (f'[cache]\npath = "{tmp_path}/cache/lkg.bin"\nsigning_key = "{key}"\n'
             f"trusted_keys = {json.dumps(trusted)}\n")
    (tmp_path / "cache").mkdir(exist_ok=True)
    return write_config(tmp_path, url, extra, port=admin_port)


async def serve_once_and_stop(config: Path) -> None:
    """Boot against a reachable control plane, publish once (exporting the cache), stop."""
    with trio.fail_after(30):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published")
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
