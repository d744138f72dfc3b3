"""Adversary drill: sink files damaged in place after a successful write (issue 18.3).

Issue 18 asks that every sink catches up; the fix re-writes a sink whose write
failed, and one whose file *vanished*. A file still there but no longer what
was written is not noticed: the snapshot file truncated by a consumer's bug or
a disk error (local readers read a torn file indefinitely), or the cache file
truncated (``GET /v1/revision`` hands followers the broken bytes), or its served
mark deleted: a cold boot during an outage then refuses the cache (exit 3),
though the replica served a good revision all along. ``/status`` says converged throughout.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio

from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, cli, free_port, run_daemon, write_config


def _snapshot_revision(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_bytes())["revision"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


async def test_sink_files_truncated_while_serving_are_written_again(tmp_path: Path) -> None:
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    snapshot = tmp_path / "out" / "snapshot.json"
    cache = tmp_path / "cache" / "lkg.bin"
    db = tmp_path / "cp.db"
    config = write_config(
        tmp_path, f"sqlite:///{db}", port=free_port(), poll_interval_s=0.2,
        extra=f'[cache]\npath = "{cache}"\nsigning_key = "{key}"\n'
              f'trusted_keys = ["{verify}"]\n[snapshot]\npath = "{snapshot}"\n')
    snapshot.parent.mkdir()
    await acli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(90):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            await poll_until(lambda: _snapshot_revision(snapshot) == 1 and cache.exists())
            whole = cache.stat().st_size
            # Damaged in place: same inode, fewer bytes.
            with snapshot.open("r+b") as f:
                f.truncate(7)
            with cache.open("r+b") as f:
                f.truncate(whole // 2)
            mark = Path(f"{cache}.served")
            mark.unlink()
            with trio.move_on_after(5):  # 25 polls
                await poll_until(lambda: _snapshot_revision(snapshot) == 1
                                 and cache.stat().st_size == whole and mark.exists())
            assert _snapshot_revision(snapshot) == 1, (
                "the snapshot file was truncated while revision 1 served; 25 polls later it "
                f"still reads {snapshot.read_bytes()!r}")
            assert cache.stat().st_size == whole, (
                f"the cache was truncated to {whole // 2} of {whole} bytes while revision 1 "
                f"served; 25 polls later it has {cache.stat().st_size}")
            assert mark.read_text().strip() == "1", "the deleted served mark was not restored"
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
        # A cold boot during an outage serves what was served.
        db.rename(tmp_path / "away.db")
        async with run_daemon(config) as booted:
            line = await booted.wait_log("serving the last-known-good cache")
            assert line["revision"] == 1
            booted.signal(signal.SIGTERM)
            assert await booted.wait() == 0
