"""An operator changes the daemon's role on the real server (real process).

A refusal at connect (``NOLOGIN``, ``REVOKE CONNECT``) is ``denied`` with
``control_plane_up`` true: the database answered. A connection that answered
``invalid`` is not kept, so a session setting the operator fixes is seen at
the next attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from tests.health import status
from tests.pgfaults import dbname, login_role, sql
from tests.proc import EXAMPLE, Daemon, acli, free_port, run_daemon, write_config

REFUSED = "convergence attempt refused by the control plane; previous snapshot keeps serving"



async def _terminate(pg_url: str, role: str) -> None:
    await sql(pg_url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      f"WHERE usename = '{role}'")


@asynccontextmanager
async def _as_role(tmp_path: Path, pg_url: str) -> AsyncIterator[tuple[str, int, Daemon]]:
    """Revision 1 served by a daemon connected as a role of its own: (role, admin port, daemon)."""
    admin = write_config(tmp_path, pg_url)
    await acli("db", "migrate", "--config", str(admin))
    await acli("publish", "--config", str(admin), str(EXAMPLE))
    async with login_role(pg_url) as (role, role_url):
        port = free_port()
        daemon_dir = tmp_path / "daemon"
        daemon_dir.mkdir()
        config = write_config(daemon_dir, role_url, port=port, poll_interval_s=0.2,
                              listen=False, backoff_max_s=0.5)
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            try:
                yield role, port, daemon
            finally:
                await sql(pg_url, f'ALTER ROLE "{role}" LOGIN')
                await sql(pg_url, f'GRANT CONNECT ON DATABASE "{dbname(pg_url)}" TO PUBLIC')
                await sql(pg_url, f'ALTER ROLE "{role}" RESET search_path')


async def _assert_denied_and_up(daemon: Daemon, port: int, text: str) -> None:
    line = await daemon.wait_log(REFUSED, reason="denied")
    assert text in line["detail"], line
    doc = await status(port)
    assert doc["revision"]["control_plane_up"] is True
    assert doc["revision"]["active"] == 1
    assert not [entry for entry in daemon.lines
                if str(entry.get("event", "")).startswith("control plane unreachable")]


async def test_a_role_not_permitted_to_log_in_is_denied_with_the_control_plane_up(
    tmp_path: Path, pg_url: str
) -> None:
    with trio.fail_after(60):
        async with _as_role(tmp_path, pg_url) as (role, port, daemon):
            await sql(pg_url, f'ALTER ROLE "{role}" NOLOGIN')
            await _terminate(pg_url, role)
            await _assert_denied_and_up(daemon, port, "not permitted to log in")


async def test_a_revoked_connect_grant_is_denied_with_the_control_plane_up(
    tmp_path: Path, pg_url: str
) -> None:
    with trio.fail_after(60):
        async with _as_role(tmp_path, pg_url) as (role, port, daemon):
            await sql(pg_url, f'REVOKE CONNECT ON DATABASE "{dbname(pg_url)}" FROM PUBLIC')
            await _terminate(pg_url, role)
            await _assert_denied_and_up(daemon, port, "permission denied for database")


async def test_a_session_setting_fixed_by_the_operator_is_seen_at_the_next_attempt(
    tmp_path: Path, pg_url: str
) -> None:
    with trio.fail_after(60):
        async with _as_role(tmp_path, pg_url) as (role, _port, daemon):
            await sql(pg_url, f'ALTER ROLE "{role}" SET search_path = nowhere')
            await _terminate(pg_url, role)
            await daemon.wait_log(REFUSED, reason="invalid")
            await trio.sleep(4)  # the operator's fix comes 4 s later: real time on purpose
            await sql(pg_url, f'ALTER ROLE "{role}" RESET search_path')
            await acli("publish", "--config", str(write_config(tmp_path, pg_url)),
                       str(EXAMPLE), "--force")
            with trio.fail_after(5):  # the next attempt, not a reconnect after minutes
                await daemon.wait_log("published", revision=2)
