"""The cache always holds the revision that was served, through the real process.

Thirty rounds of: publish, stop the daemon the moment the snapshot file shows
the new revision (SIGTERM; separately SIGKILL; a thread spinning on the file's
inode sends the signal within microseconds of the rename, the window in which
an export that followed the swap would not have started), then boot with the control
plane unreachable (the SQLite file moved away) and read which revision the
cache restored. SIGTERM: exactly the one the snapshot file showed. SIGKILL:
that one or the one before, never older, and never a refusal.
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

ROUNDS = 30


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def signal_when_replaced(path: Path, pid: int, signum: int, before: int | None,
                         deadline_s: float) -> bool:
    """Spin until ``path`` is another file, then signal ``pid`` at once; False on timeout."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if _inode(path) != before:
            os.kill(pid, signum)
            return True
    return False


async def test_sigterm_right_after_publish_never_leaves_the_cache_behind(
    tmp_path: Path,
) -> None:
    with trio.fail_after(600):
        results = await rounds(tmp_path, signal.SIGTERM)
    assert len(results) == ROUNDS
    wrong = [(showed, restored) for showed, restored in results if showed != restored]
    assert not wrong, f"(snapshot file showed, cache restored): {wrong}"


async def test_sigkill_right_after_publish_restores_that_or_the_previous(
    tmp_path: Path,
) -> None:
    with trio.fail_after(600):
        results = await rounds(tmp_path, signal.SIGKILL)
    assert len(results) == ROUNDS
    wrong = [(showed, restored) for showed, restored in results
             if restored not in (showed, showed - 1)]
    assert not wrong, f"(snapshot file showed, cache restored): {wrong}"


async def rounds(tmp_path: Path, signum: int) -> list[tuple[int, int]]:
    """One daemon per round: publish, stop on the snapshot file, cold boot, back online."""
    db = tmp_path / "cp.db"
    away = tmp_path / "away.db"
    snapshot = tmp_path / "snapshot.json"
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    config = write_config(
        tmp_path, f"sqlite:///{db}", poll_interval_s=0.05, grace_s=5.0,
        extra=f'[cache]\npath = "{tmp_path / "cache" / "lkg.bin"}"\n'
              f'signing_key = "{key}"\ntrusted_keys = ["{verify}"]\n'
              f'[snapshot]\npath = "{snapshot}"\n')
    (tmp_path / "first.json").write_bytes(body(0))
    cli("publish", "--config", str(config), str(tmp_path / "first.json"))
    results: list[tuple[int, int]] = []
    for n in range(1, ROUNDS + 1):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            await daemon.wait_log("published")
            stopper = threading.Thread(target=signal_when_replaced, args=(
                snapshot, daemon.process.pid, signum, _inode(snapshot), 30.0))
            stopper.start()
            rid = await trio.to_thread.run_sync(publish, db, n)
            await trio.to_thread.run_sync(stopper.join)
            await daemon.wait()
        showed = shown(snapshot)
        assert showed == rid, f"round {n}: the snapshot file shows {showed}, not {rid}"
        await trio.to_thread.run_sync(move_control_plane, db, away)
        async with run_daemon(config) as booted:
            line = await booted.wait_log("serving the last-known-good cache")
            results.append((showed, int(line["revision"])))
            booted.signal(signal.SIGTERM)
            assert await booted.wait() == 0
        await trio.to_thread.run_sync(move_control_plane, away, db)
    return results
