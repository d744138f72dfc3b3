"""A replica on a real PostgreSQL hot standby converges by polling, with no restarts.

The standby is a second cluster made with ``pg_basebackup -R`` from the run's
server (``pg_server``) and started with ``pg_ctl`` on a free port, both of that
server's major version, by a session-scoped fixture (:mod:`tests.pgfleet`),
stopped in its teardown. The primary needs a loopback replication entry in
pg_hba.conf: the suite's own server has it; for a system server the fixture adds
``host replication all 127.0.0.1/32 trust`` when it is missing (idempotent)
and reloads the primary; .ci/run says so too.

The replica keeps ``listen = true`` (the default): LISTEN cannot run during
recovery, so the LISTEN child must notice, say so once at info level, and idle,
rather than crash-loop or log an outage every backoff.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from tests.pgfleet import hot_standby, wait_replayed
from tests.pgserver import Server
from tests.postgres import sql_publish
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config

POLL_S = 1.0
# Replication, compile and publish on a loaded two-core machine, beyond the poll itself.
SLACK_S = 0.6
STANDBY_LINE = ("the control plane is a hot standby: LISTEN cannot run during recovery and "
                "NOTIFY is not replicated; converging by polling alone")


@pytest.fixture(scope="session")
def standby_dsn(pg_server: Server) -> Iterator[str]:
    with hot_standby(pg_server) as dsn:
        yield dsn


def on_standby(standby_dsn: str, pg_url: str) -> str:
    base = standby_dsn.rpartition("/")[0]
    return f"{base}/{pg_url.rpartition('/')[2]}"


async def test_replica_on_hot_standby_converges_every_publish_within_one_poll(
    tmp_path: Path, pg_url: str, standby_dsn: str
) -> None:
    primary_config = write_config(tmp_path, pg_url)
    await acli("db", "migrate", "--config", str(primary_config))
    await acli("publish", "--config", str(primary_config), str(EXAMPLE))
    replica_dir = tmp_path / "replica"
    replica_dir.mkdir()
    url = on_standby(standby_dsn, pg_url)
    await trio.to_thread.run_sync(wait_replayed, pg_url, url)
    port = free_port()
    config = write_config(replica_dir, url, port=port, poll_interval_s=POLL_S)
    with trio.fail_after(90):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            await daemon.wait_log(STANDBY_LINE)
            for _ in range(3):
                start = trio.current_time()
                rid = await trio.to_thread.run_sync(sql_publish, pg_url)
                await daemon.wait_log("published", revision=rid)
                took = trio.current_time() - start
                assert took <= POLL_S + SLACK_S, f"revision {rid} took {took:.2f} s"
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                status = (await http.get("/status")).json()
            assert status["revision"]["active"] == rid
            assert status["revision"]["source"] == "control_plane"
            for name, child in status["children"].items():
                assert child["restarts"] == 0, (name, child)
                assert child["state"] == "running", (name, child)
            standby_lines = [line for line in daemon.lines if line.get("event") == STANDBY_LINE]
            assert len(standby_lines) == 1 and standby_lines[0]["level"] == "info"
            assert not [line for line in daemon.lines if line.get("level") in ("error", "warning")]
