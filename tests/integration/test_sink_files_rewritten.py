"""Sink files damaged or removed after a successful write are written again, through the real process.

A file still there but no longer what was written (the snapshot file truncated by
a consumer's bug or a disk error, the cache file truncated, its served mark
deleted), and a sink directory removed and re-created (a tmpfiles cleaner, an
operator clearing it, a volume re-mounted): the replica writes each sink again
without a new publish, so local readers never read a torn or missing file and a
cold boot during an outage still finds a cache it trusts.
"""

from __future__ import annotations

import json
import shutil
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


async def test_sinks_rewritten_after_their_directory_is_removed_and_recreated(
        tmp_path: Path) -> None:
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    out = tmp_path / "out"
    snapshot = out / "snapshot.json"
    cache = out / "cache" / "lkg.bin"
    config = write_config(
        tmp_path, f"sqlite:///{tmp_path / 'cp.db'}", port=free_port(), poll_interval_s=0.2,
        extra=f'[cache]\npath = "{cache}"\nsigning_key = "{key}"\n'
              f'trusted_keys = ["{verify}"]\n[snapshot]\npath = "{snapshot}"\n')
    out.mkdir()
    await acli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            await poll_until(lambda: snapshot.exists() and cache.exists())
            # Renamed away first: the daemon may write into it while rmtree walks it.
            gone = tmp_path / "gone"
            out.rename(gone)
            shutil.rmtree(gone)
            (out / "cache").mkdir(parents=True, mode=0o700)
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("SIGHUP: log level set")
            with trio.move_on_after(5):  # 25 polls and a SIGHUP
                await poll_until(lambda: snapshot.exists() and cache.exists())
            assert snapshot.exists() and cache.exists(), (
                f"the sink directory was removed and re-created while revision 1 served; "
                f"after a SIGHUP and 25 polls: snapshot file exists={snapshot.exists()}, "
                f"cache exists={cache.exists()}")
            assert json.loads(snapshot.read_text())["revision"] == 1
