"""``control_plane_up`` means the control plane answered, refusals included (real process).

A revoked grant is a refusal from a database that answered: ``control_plane_up``
stays true (gauge and ``/status``), the refusal is in ``last_rejection``, and no
outage line sends the operator to the network.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.pgfaults import login_role, sql
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config


async def _get(port: int, path: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5.0) as client:
        return await client.get(f"http://127.0.0.1:{port}{path}")


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_revoked_select_grant_keeps_control_plane_up_and_reports_the_refusal(
    tmp_path: Path, pg_url: str
) -> None:
    admin = write_config(tmp_path, pg_url)
    await acli("db", "migrate", "--config", str(admin))
    await acli("publish", "--config", str(admin), str(EXAMPLE))
    async with login_role(pg_url) as (role, role_url):
        port = free_port()
        daemon_dir = tmp_path / "daemon"
        daemon_dir.mkdir()
        config = write_config(daemon_dir, role_url, port=port, poll_interval_s=0.2)
        with trio.fail_after(60):
            async with run_daemon(config) as daemon:
                await daemon.wait_log("published", revision=1)
                await sql(pg_url, f'REVOKE SELECT ON supervisor_desired FROM "{role}"')
                line = await daemon.wait_log(
                    "convergence attempt refused by the control plane; previous snapshot "
                    "keeps serving")
                assert line["reason"] == "denied" and "permission denied" in line["detail"]
                status: dict[str, Any] = (await _get(port, "/status")).json()
                revision = status["revision"]
                assert revision["control_plane_up"] is True
                assert revision["last_rejection"]["reason"] == "denied"
                assert revision["active"] == 1
                metrics = (await _get(port, "/metrics")).text
                assert _gauge(metrics, "supervisor_control_plane_up") == 1.0
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0
    assert not [entry for entry in daemon.lines
                if str(entry.get("event", "")).startswith("control plane unreachable")]
    assert not [entry for entry in daemon.lines if entry.get("control_plane_up") is False]
