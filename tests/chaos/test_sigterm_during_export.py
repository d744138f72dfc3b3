"""SIGTERM between the cache export and the swap restores what was served, through the real process.

The export runs before the swap. A stop that lands after the cache file was
replaced but before the swap (the export thread is not abandoned, so the
cancellation surfaces right after it returns, and the swap never runs) must not
leave the cache one revision ahead of everything served: a boot during an
outage restores the revision the snapshot file showed, never one this replica
did not serve. The stop is sent the moment the cache file changes (a thread
spinning on its inode), a window that stopping when the snapshot file changes
cannot reach.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import trio

from tests.chaos.support import body, move_control_plane, publish, shown
from tests.proc import cli, run_daemon, write_config

pytestmark = pytest.mark.chaos

ROUNDS = 15


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _kill_when_replaced(path: Path, pid: int, before: int | None, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if _inode(path) != before:
            os.kill(pid, signal.SIGTERM)
            return True
    return False


async def test_sigterm_as_the_cache_changes_restores_what_was_served(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    away = tmp_path / "away.db"
    snapshot = tmp_path / "snapshot.json"
    cache = tmp_path / "cache" / "lkg.bin"
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    config = write_config(
        tmp_path, f"sqlite:///{db}", poll_interval_s=0.05, grace_s=5.0,
        extra=f'[cache]\npath = "{cache}"\nsigning_key = "{key}"\n'
              f'trusted_keys = ["{verify}"]\n[snapshot]\npath = "{snapshot}"\n')
    (tmp_path / "first.json").write_bytes(body(0))
    cli("publish", "--config", str(config), str(tmp_path / "first.json"))
    results: list[tuple[int | None, int]] = []
    with trio.fail_after(600):
        for n in range(1, ROUNDS + 1):
            async with run_daemon(config) as daemon:
                await daemon.wait_log("ready")
                await daemon.wait_log("published")
                before = _inode(cache)
                stopper = threading.Thread(
                    target=_kill_when_replaced, args=(cache, daemon.process.pid, before, 10.0))
                stopper.start()
                await trio.to_thread.run_sync(publish, db, n)
                await trio.to_thread.run_sync(stopper.join)
                assert await daemon.wait() == 0
            showed = shown(snapshot)
            await trio.to_thread.run_sync(move_control_plane, db, away)
            async with run_daemon(config) as booted:
                line = await booted.wait_log("serving the last-known-good cache")
                results.append((showed, int(line["revision"])))
                booted.signal(signal.SIGTERM)
                assert await booted.wait() == 0
            await trio.to_thread.run_sync(move_control_plane, away, db)
    ahead = [(s, r) for s, r in results if s != r]
    assert not ahead, (
        f"(snapshot file showed, cache restored) after SIGTERM as the cache changed: {ahead} "
        f"of {len(results)} rounds restored a revision the replica never served")
