"""Shutdown of the real daemon while its control-plane query hangs on a held lock."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import trio

from tests.chaos.support import daemon_backends, wait_backend_on_lock
from tests.proc import EXAMPLE, NotifySocket, acli, run_daemon, write_config


async def test_sigterm_during_a_hung_query_exits_within_the_grace(
    tmp_path: Path, pg_url: str
) -> None:
    config = write_config(tmp_path, pg_url, grace_s=3.0, poll_interval_s=0.2)
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
                with trio.fail_after(10):
                    await wait_backend_on_lock(pg_url)
                daemon.signal(signal.SIGTERM)
                start = trio.current_time()
                code = await daemon.wait()
                took = trio.current_time() - start
            finally:
                await trio.to_thread.run_sync(locker.close)
    assert code == 0
    assert took < 3.0, took
    # The hung statement was cancelled server-side, not left behind.
    assert await trio.to_thread.run_sync(
        lambda: daemon_backends(pg_url, waiting_on_lock=True)) == []
    notify.close()
