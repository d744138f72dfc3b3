"""Sinks on a full disk catch up, through the real process.

The snapshot file and the cache live on a small tmpfs mounted by the test (root
only: skipped with the reason otherwise; CI runs as root). A filler file takes
every free byte, so writes fail with ENOSPC exactly as on a full disk.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from tests import needs
from tests.proc import acli, cli, free_port, run_daemon, write_config


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs",
                             str(mount)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        needs.missing("a tmpfs mount", f"mount -t tmpfs failed here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk``; return the filler to delete."""
    filler = disk / f"filler-{len(list(disk.glob('filler-*')))}"
    with open(filler, "wb", buffering=0) as f:
        for size in (4096, 1):  # big writes, then down to the last byte
            while True:
                try:
                    f.write(b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    return filler


def body(tag: str) -> bytes:
    return json.dumps({"schema_version": 1, "aliases": {
        tag: {"upstream": f"https://{tag}.example/v1"}}}).encode()


def limit_inodes(disk: Path, spare: int | None) -> None:
    """Allow ``spare`` more files and directories on ``disk`` (None: lift the limit).

    Making a directory takes an inode, not a block, on tmpfs: a full inode
    table is the full disk a missing directory is made again on.
    """
    # The daemon may make or remove a file between the count and the remount (a temporary
    # file of an atomic write): a limit below the inodes then in use is refused (EINVAL),
    # so count again and retry.
    for _ in range(50):
        st = os.statvfs(disk)
        total = 100_000 if spare is None else st.f_files - st.f_ffree + spare
        result = subprocess.run(["mount", "-o", f"remount,nr_inodes={total}", str(disk)],
                                capture_output=True, text=True, check=False)
        if result.returncode == 0:
            return
    raise AssertionError(f"cannot limit the inodes of {disk}: {result.stderr}")


def shown(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_bytes())["revision"])
    except (OSError, ValueError, KeyError):
        return None


async def publish(config: Path, tmp_path: Path, tag: str) -> None:
    doc = tmp_path / f"{tag}.json"
    doc.write_bytes(body(tag))
    await acli("publish", "--config", str(config), str(doc))


def setup(tmp_path: Path, disk: Path) -> tuple[Path, Path, Path]:
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    db = tmp_path / "cp.db"
    snapshot = disk / "snapshot.json"
    config = write_config(
        tmp_path, f"sqlite:///{db}", poll_interval_s=0.2,
        extra=f'[cache]\npath = "{disk / "cache" / "lkg.bin"}"\nsigning_key = "{key}"\n'
              f'trusted_keys = ["{verify}"]\n[snapshot]\npath = "{snapshot}"\n')
    return config, db, snapshot


async def test_snapshot_file_catches_up_after_space_is_freed(tmp_path: Path,
                                                             small_disk: Path) -> None:
    config, _, snapshot = setup(tmp_path, small_disk)
    await publish(config, tmp_path, "r1")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            assert shown(snapshot) == 1
            filler = fill(small_disk)
            await publish(config, tmp_path, "r2")
            await daemon.wait_log("published", revision=2)
            await daemon.wait_log("sink write failed; still serving, retrying every poll",
                                  sink="snapshot_file")
            assert shown(snapshot) == 1  # the disk is full
            filler.unlink()
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("sink write recovered", sink="snapshot_file", revision=2)
            assert shown(snapshot) == 2  # converged all along: no new revision was needed
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


def rollback(db: Path, to: int) -> None:
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE supervisor_desired SET revision_id = ?", (to,))


async def test_rollback_with_a_failed_export_never_boots_the_rolled_back_revision(
    tmp_path: Path, small_disk: Path,
) -> None:
    config, db, _ = setup(tmp_path, small_disk)
    await publish(config, tmp_path, "r1")
    await publish(config, tmp_path, "r2")
    away = tmp_path / "away.db"
    with trio.fail_after(90):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            filler = fill(small_disk)
            await trio.to_thread.run_sync(rollback, db, 1)  # the operator rolls back
            await daemon.wait_log("published", revision=1)
            await daemon.wait_log("removed a cache newer than the revision being served (a "
                                  "rollback whose export failed): a boot now uses the control "
                                  "plane rather than the revision rolled back from")
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
        # Disk still full, control plane unreachable: refuse, never serve revision 2.
        db.rename(away)
        result = await acli("run", "--config", str(config), check=False, timeout=30)
        assert result.returncode == 3, result.stderr
        assert "does not exist yet" in result.stderr
        away.rename(db)
        # Still full (the removed cache's bytes taken too), then space freed: the
        # next poll exports revision 1, and a cold boot serves it.
        more = fill(small_disk)
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            await daemon.wait_log("sink write failed; still serving, retrying every poll",
                                  sink="cache")
            filler.unlink()
            more.unlink()
            await daemon.wait_log("sink write recovered", sink="cache", revision=1)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
        db.rename(away)
        async with run_daemon(config) as daemon:
            line = await daemon.wait_log("serving the last-known-good cache")
            assert line["revision"] == 1
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def test_a_sink_directory_made_again_on_a_full_disk_reports_the_full_disk(
    tmp_path: Path, small_disk: Path,
) -> None:
    snap_dir = small_disk / "snap"
    snap_dir.mkdir()
    snap_dir.chmod(0o755)
    snapshot = snap_dir / "snapshot.json"
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'cp.db'}", port=port,
                          poll_interval_s=0.2, extra=f'[snapshot]\npath = "{snapshot}"\n')
    await publish(config, tmp_path, "r1")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            assert shown(snapshot) == 1
            # Stopped meanwhile: a poll between the removal and the limit would make the
            # directory again on a disk that is not full yet, and nothing would fail.
            daemon.signal(signal.SIGSTOP)
            try:
                snapshot.unlink()
                snap_dir.rmdir()
                limit_inodes(small_disk, 0)
            finally:
                daemon.signal(signal.SIGCONT)
            try:
                await daemon.wait_log("sink write failed; still serving, retrying every poll",
                                      sink="snapshot_file")
                async with httpx.AsyncClient(timeout=5.0) as client:
                    sinks = (await client.get(f"http://127.0.0.1:{port}/status")).json()["sinks"]
                # The directory is missing because it cannot be made: the disk is
                # full, and that is what the operator must be told.
                assert sinks["snapshot_file"] == "failing"
                assert "No space left on device" in sinks["snapshot_file_error"], sinks
                assert str(snap_dir) in sinks["snapshot_file_error"], sinks
            finally:
                limit_inodes(small_disk, None)
            await daemon.wait_log("sink write recovered", sink="snapshot_file")
            assert shown(snapshot) == 1 and stat.S_IMODE(snap_dir.stat().st_mode) == 0o755
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
