"""Sinks heal: a sink directory removed at runtime is made again, and /status says how each is.

Through the real process and real PostgreSQL: the cache directory and the
snapshot file's directory are removed while revision 1 serves; the next
publish makes both again with the modes they had at start, the cache file is
back and ``GET /v1/revision`` serves again. A cache directory that cannot be
made (a regular file where it was) turns ``/status`` ``sinks.cache`` to
``failing`` with the error, and back to ``ok`` once a write succeeds.
"""

from __future__ import annotations

import shutil
import signal
import stat
from pathlib import Path
from typing import Any

import httpx
import trio

from supervisor.sinks.lkg.fileformat import peek_revision
from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, cli, free_port, run_daemon, write_config


async def _get(port: int, path: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5.0) as client:
        return await client.get(f"http://127.0.0.1:{port}{path}")


async def _sinks(port: int) -> dict[str, Any]:
    return dict((await _get(port, "/status")).json()["sinks"])


async def _served_revision(port: int) -> int | None:
    answer = await _get(port, "/v1/revision")
    return peek_revision(answer.content) if answer.status_code == 200 else None


def _remove(directory: Path) -> None:
    # Renamed away first: the daemon may write into it while rmtree walks it.
    gone = directory.with_name(directory.name + ".gone")
    directory.rename(gone)
    shutil.rmtree(gone)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_removed_sink_directories_are_made_again_and_status_reports_sinks(
    tmp_path: Path, pg_url: str
) -> None:
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    cache_dir, snap_dir = tmp_path / "cache", tmp_path / "snap"
    cache_dir.mkdir(mode=0o750)
    cache_dir.chmod(0o750)
    snap_dir.mkdir()
    snap_dir.chmod(0o755)
    cache, snapshot = cache_dir / "lkg.bin", snap_dir / "snapshot.json"
    port = free_port()
    config = write_config(
        tmp_path, pg_url, port=port, poll_interval_s=0.2,
        extra=f'[cache]\npath = "{cache}"\nsigning_key = "{key}"\n'
              f'trusted_keys = ["{verify}"]\n[snapshot]\npath = "{snapshot}"\n')
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(90):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            await poll_until(lambda: snapshot.exists())
            assert await _served_revision(port) == 1
            assert await _sinks(port) == {
                "cache": "ok", "snapshot_file": "ok",
                "cache_error": None, "snapshot_file_error": None, "hook": None}
            metrics = (await _get(port, "/metrics")).text
            assert 'supervisor_sink_state{sink="cache",state="ok"} 1.0' in metrics

            # Both directories removed while serving: the next publish makes them again.
            _remove(cache_dir)
            _remove(snap_dir)
            await acli("publish", "--config", str(config), "--force", str(EXAMPLE))
            await daemon.wait_log("published", revision=2)
            await poll_until(lambda: snapshot.exists() and cache.exists())
            assert (_mode(cache_dir), _mode(snap_dir)) == (0o750, 0o755)
            assert await _served_revision(port) == 2
            assert (await _sinks(port))["cache"] == "ok"

            # A regular file where the cache directory was: it cannot be made.
            _remove(cache_dir)
            cache_dir.write_text("not a directory")
            await acli("publish", "--config", str(config), "--force", str(EXAMPLE))
            await daemon.wait_log("published", revision=3)
            sinks = await _sinks(port)
            assert sinks["cache"] == "failing" and sinks["snapshot_file"] == "ok"
            assert str(cache) in sinks["cache_error"]
            assert await _served_revision(port) is None
            metrics = (await _get(port, "/metrics")).text
            assert 'supervisor_sink_state{sink="cache",state="failing"} 1.0' in metrics

            # Cleared: the next poll makes the directory again and the cache recovers.
            cache_dir.unlink()
            await daemon.wait_log("sink write recovered", sink="cache")
            assert await _sinks(port) == {
                "cache": "ok", "snapshot_file": "ok",
                "cache_error": None, "snapshot_file_error": None, "hook": None}
            assert _mode(cache_dir) == 0o750
            assert await _served_revision(port) == 3
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
