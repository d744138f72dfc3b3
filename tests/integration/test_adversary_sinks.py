"""Adversary drill: sinks whose files vanish while the write "succeeded" (issue 18.3).

Issue 18 saw: "with the snapshot directory deleted and re-created, it stayed
empty". The fix retries a sink only while a write of it has *failed*; a file
removed after a successful write (a tmpfiles cleaner, an operator clearing the
directory, a volume re-mounted) is never written again, not on any poll and not
on SIGHUP, until a new revision is published. Local consumers read nothing, and
a reboot during an outage finds no cache (exit 3) though the replica served a
good revision all along.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import trio

from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, cli, free_port, run_daemon, write_config


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
