"""Shutdown of the real daemon while its control-plane query hangs on a held lock."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import trio

from tests.polling import poll_until
from tests.proc import EXAMPLE, NotifySocket, acli, run_daemon, write_config


def blocked_backends(pg_url: str) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'").fetchone()
    return int(row[0]) if row else 0


async def test_sigterm_during_a_hung_query_exits_within_the_grace(
    tmp_path: Path, pg_url: str
) -> None:
    config = write_config(tmp_path, pg_url, grace_s=3.0)
    config.write_text(config.read_text().replace("poll_interval_s = 1", "poll_interval_s = 0.2"))
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    with trio.fail_after(60):
        async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
            await notify.wait_for("READY=1")
            locker = await trio.to_thread.run_sync(psycopg.connect, pg_url)
            try:
                await trio.to_thread.run_sync(
                    locker.execute, "LOCK TABLE supervisor_desired IN ACCESS EXCLUSIVE MODE")
                # Wait (bounded, polling external state) until the daemon's poll is stuck.
                async def blocked() -> bool:
                    return await trio.to_thread.run_sync(blocked_backends, pg_url) > 0

                with trio.fail_after(10):
                    await poll_until(blocked)
                daemon.signal(signal.SIGTERM)
                start = trio.current_time()
                code = await daemon.wait()
                took = trio.current_time() - start
            finally:
                await trio.to_thread.run_sync(locker.close)
    assert code == 0
    assert took < 3.0, took
    # The hung statement was cancelled server-side, not left behind.
    assert await trio.to_thread.run_sync(blocked_backends, pg_url) == 0
    notify.close()
