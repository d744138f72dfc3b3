"""The LISTEN child through the real process: only a notification can converge this fast.

The poll interval is an hour, so a revision published during a test can only
have been converged through a notification (or the reconnect wake-up).
"""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import trio

from tests.proc import EXAMPLE, NotifySocket, acli, free_port, run_daemon, write_config
from tests.tcpproxy import proxied_url, tcp_proxy


def hour_poll(tmp_path: Path, url: str) -> Path:
    return write_config(tmp_path, url, poll_interval_s=3600)


def sql_publish(pg_url: str) -> int:
    body = b'{"schema_version": 1, "aliases": {"sql": {"upstream": "https://sql.example/"}}}'
    with psycopg.connect(pg_url) as conn:
        rid = conn.execute(
            "INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)"
            " VALUES (1, %s, sha256(%s), 'plain sql') RETURNING id", (body, body),
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO supervisor_desired (singleton, revision_id, updated_at)"
            " VALUES (true, %s, now()) ON CONFLICT (singleton) DO UPDATE"
            " SET revision_id = excluded.revision_id, updated_at = now()", (rid,))
    return int(rid)


def listener_pids(pg_url: str) -> list[int]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE 'LISTEN%%' AND pid <> pg_backend_pid()").fetchall()
    return [int(row[0]) for row in rows]


async def test_cli_and_plain_sql_publishes_converge_through_notifications(
    tmp_path: Path, pg_url: str
) -> None:
    config = hour_poll(tmp_path, pg_url)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    with trio.fail_after(60):
        async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
            await notify.wait_for("READY=1")
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            await daemon.wait_log("published", revision=2)
            rid = await trio.to_thread.run_sync(sql_publish, pg_url)
            await daemon.wait_log("published", revision=rid)
            # Shutdown while the child waits on its connection: prompt.
            daemon.signal(signal.SIGTERM)
            start = trio.current_time()
            assert await daemon.wait() == 0
            assert trio.current_time() - start < 2.0
    notify.close()


async def test_listener_killed_reconnects_and_converges_without_the_poll(
    tmp_path: Path, pg_url: str
) -> None:
    config = hour_poll(tmp_path, pg_url)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    with trio.fail_after(60):
        async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
            await notify.wait_for("READY=1")
            pids: list[int] = []
            while not pids:
                pids = await trio.to_thread.run_sync(listener_pids, pg_url)
                if not pids:
                    await daemon.wait_log("listening for desired-state notifications")
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
            # Published while the listener is down or reconnecting: the NOTIFY may
            # be lost, and the reconnect wake-up must cover it.
            rid = await trio.to_thread.run_sync(sql_publish, pg_url)
            await daemon.wait_log("published", revision=rid)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    notify.close()


async def test_shutdown_while_the_listener_reconnects_is_prompt(tmp_path: Path, pg_url: str) -> None:
    port = free_port()
    url = proxied_url(pg_url, port)
    config = hour_poll(tmp_path, url)
    async with tcp_proxy(port) as proxy:
        await acli("db", "migrate", "--config", str(config))
        await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
        notify = NotifySocket(tmp_path / "notify")
        await notify.bind()
        with trio.fail_after(60):
            async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
                await notify.wait_for("READY=1")
                # READY=1 does not wait for LISTEN: wait until it is connected.
                await daemon.wait_log("listening for desired-state notifications")
                proxy.stop()  # cuts every connection: the listener starts reconnecting
                await daemon.wait_log("LISTEN connection unreachable")
                daemon.signal(signal.SIGTERM)
                start = trio.current_time()
                assert await daemon.wait() == 0
                assert trio.current_time() - start < 3.0
        notify.close()
