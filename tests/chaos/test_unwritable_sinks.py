"""The snapshot file's and the cache's directories become unwritable while the daemon runs.

The tests run as root, for whom chmod stops nothing; what stops root too is a
path whose parent is not a directory. So each sink's directory is moved away
and a regular file put in its place (ENOTDIR), then the directory is put back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.chaos.support import (
    chaos_config,
    count_lines,
    metric,
    publish_once,
    revision_body,
    stop_within_grace,
    tag_of,
    wait_count,
)
from tests.polling import poll_until
from tests.proc import Daemon, acli, cli, run_daemon

pytestmark = pytest.mark.chaos

FAILED = "sink write failed; still serving, retrying every poll"
RECOVERED = "sink write recovered"


def _break(directory: Path) -> None:
    directory.rename(directory.with_name(directory.name + ".away"))
    directory.write_text("not a directory any more\n")


def _repair(directory: Path) -> None:
    directory.unlink()
    directory.with_name(directory.name + ".away").rename(directory)


def _on_disk(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "snapshot.json").read_bytes())
    return data


def _warnings(daemon: Daemon, event: str) -> dict[str, int]:
    return {sink: count_lines(daemon, event, sink=sink) for sink in ("snapshot_file", "cache")}


async def _settle(daemon: Daemon, event: str, n: int) -> None:
    """The writes after a publish happen after its log line: wait for their outcome lines."""
    for sink in ("snapshot_file", "cache"):
        await wait_count(daemon, event, n, sink=sink)


async def test_unwritable_sink_directories_keep_serving_with_one_warning_per_streak(
    tmp_path: Path, pg_url: str
) -> None:
    """Must not be lost: serving (every revision published while the sinks fail is
    active and on /v1/snapshot), the signal-to-noise of the log (exactly one
    warning per sink per failure streak, one recovery line when it heals), the
    count of failures (``supervisor_sink_write_failures_total``), and the files
    themselves once writable again (they catch up with the active revision).
    """
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.strip().splitlines()[-1].split()[-1]
    snap_dir, cache_dir = tmp_path / "snap", tmp_path / "cache"
    snap_dir.mkdir()
    cache_dir.mkdir()
    config, port = chaos_config(
        tmp_path, pg_url, poll_interval_s=3600,
        extra=(f'[snapshot]\npath = "{snap_dir}/snapshot.json"\n'
               f'[cache]\npath = "{cache_dir}/lkg.bin"\nsigning_key = "{key}"\n'
               f"trusted_keys = {json.dumps([verify])}\n"))
    base = f"http://127.0.0.1:{port}"
    await acli("db", "migrate", "--config", str(config))
    await trio.to_thread.run_sync(publish_once, pg_url, revision_body(10, "r1"))

    async def publish(daemon: Daemon, http: httpx.AsyncClient, tag: str) -> int:
        rid = await trio.to_thread.run_sync(publish_once, pg_url, revision_body(10, tag))
        await daemon.wait_log("published", revision=rid)
        data = (await http.get(f"{base}/v1/snapshot")).json()
        assert data["revision"] == rid and tag_of(data) == {tag}
        return rid

    with trio.fail_after(60):
        async with run_daemon(config) as daemon, httpx.AsyncClient(timeout=5) as http:
            await daemon.wait_log("ready")
            assert (snap_dir / "snapshot.json").exists() and (cache_dir / "lkg.bin").exists()

            _break(snap_dir)
            _break(cache_dir)
            await publish(daemon, http, "r2")
            await _settle(daemon, FAILED, 1)
            await publish(daemon, http, "r3")
            assert _warnings(daemon, FAILED) == {"snapshot_file": 1, "cache": 1}
            assert (await http.get(f"{base}/readyz")).status_code == 200

            _repair(snap_dir)
            _repair(cache_dir)
            healed = await publish(daemon, http, "r4")
            await _settle(daemon, RECOVERED, 1)
            assert _warnings(daemon, RECOVERED) == {"snapshot_file": 1, "cache": 1}
            # The recovery line may come from the retry of r3 that the wake-up
            # for r4 runs first; r4's own write follows its publish line.
            await poll_until(lambda: _on_disk(snap_dir)["revision"] == healed)
            assert tag_of(_on_disk(snap_dir)) == {"r4"}

            _break(snap_dir)
            _break(cache_dir)
            last = await publish(daemon, http, "r5")
            await _settle(daemon, FAILED, 2)
            assert _warnings(daemon, FAILED) == {"snapshot_file": 2, "cache": 2}
            metrics = (await http.get(f"{base}/metrics")).text
            for sink in ("snapshot_file", "cache"):
                # Every failed write counts, the retries at each attempt included:
                # at least the three publishes that met a broken sink.
                assert metric(metrics, "supervisor_sink_write_failures_total", sink=sink) >= 3
            status = (await http.get(f"{base}/status")).json()["revision"]
            assert status["active"] == last and status["consecutive_failures"] == 0
            await stop_within_grace(daemon, 5.0)
    warning = next(line for line in daemon.lines if line.get("event") == FAILED)
    assert "Not a directory" in warning["error"]
