"""The LISTEN child through the real process: only a notification can converge this fast.

The poll interval is an hour, so a revision published during a test can only
have been converged through a notification (or the reconnect wake-up).
"""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import trio

from tests.health import metric, metric_sum, scrape, status
from tests.polling import poll_until
from tests.postgres import listener_pids, sql_publish
from tests.proc import EXAMPLE, NotifySocket, acli, free_port, run_daemon, write_config
from tests.tcpproxy import pg_proxy, proxied_url


def hour_poll(tmp_path: Path, url: str) -> Path:
    return write_config(tmp_path, url, poll_interval_s=3600)


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
            assert await daemon.wait() == 0
            # Every child stopped when asked, none waited out its shutdown timeout (a
            # statement about the daemon, not about how busy this machine is).
            assert not [line for line in daemon.lines
                        if line.get("event") == "child did not stop in time"]
            assert daemon.lines[-1]["event"] == "stopped"
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
    async with pg_proxy(port, pg_url) as proxy:
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
                assert await daemon.wait() == 0
                assert not [line for line in daemon.lines
                            if line.get("event") == "child did not stop in time"]
        notify.close()


async def test_status_shows_the_listener_reconnecting_while_its_setup_goes_unanswered(
    tmp_path: Path, pg_url: str
) -> None:
    port, admin_port = free_port(), free_port()
    config = write_config(tmp_path, proxied_url(pg_url, port), port=admin_port,
                          poll_interval_s=3600, backoff_initial_s=0.05, backoff_max_s=0.2,
                          control_plane_extra="read_timeout_s = 1.0")
    async with pg_proxy(port, pg_url) as proxy:
        await acli("db", "migrate", "--config", str(config))
        await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
        notify = NotifySocket(tmp_path / "notify")
        await notify.bind()
        with trio.fail_after(60):
            async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
                await notify.wait_for("READY=1")
                await daemon.wait_log("listening for desired-state notifications")
                assert (await status(admin_port))["children"]["listen"]["state"] == "running"
                # Cut, then back as a server whose sessions start and never answer.
                proxy.stop()
                proxy.stalled = True
                await proxy.start()
                await daemon.wait_log("LISTEN connection unreachable")
                # Each setup given up at read_timeout_s and retried.
                await poll_until(lambda: _reconnects_at_least(admin_port, 3))
                listen = (await status(admin_port))["children"]["listen"]
                assert listen["state"] == "reconnecting" and listen["restarts"] == 0
                proxy.stalled = False
                await daemon.wait_log("LISTEN connection reachable again")
                await poll_until(lambda: _listen_state(admin_port, "running"))
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0
        notify.close()


async def _reconnects_at_least(admin_port: int, count: float) -> bool:
    return await metric(admin_port, "supervisor_listen_reconnects_total") >= count


async def _listen_state(admin_port: int, state: str) -> bool:
    return bool((await status(admin_port))["children"]["listen"]["state"] == state)


def _attempts(metrics: str) -> float:
    return metric_sum(metrics, "supervisor_convergence_attempts_total") or 0.0


def _held(metrics: str) -> float:
    return metric_sum(metrics, "supervisor_listen_wakeups_held_total") or 0.0


async def test_a_notify_storm_by_a_role_without_privileges_is_floored(
    tmp_path: Path, pg_url: str
) -> None:
    """A role that may only connect runs ``pg_notify`` in a loop: the replica makes
    at most one convergence attempt per ``notify_min_interval_s`` (here 0.25 s),
    counts the held wake-ups, and says so in its log."""
    import secrets
    import time


    role = f"stormer_{secrets.token_hex(4)}"
    port = free_port()
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=3600)
    config.write_text(config.read_text().replace(
        "[control_plane]\n", "[control_plane]\nnotify_min_interval_s = 0.25\n"))
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")  # no grant on any table

    def notify_storm(for_s: float) -> int:
        sent = 0
        with psycopg.connect(pg_url, user=role, autocommit=True) as conn:
            end = time.monotonic() + for_s
            while time.monotonic() < end:
                conn.execute("SELECT pg_notify('supervisor_desired', '1')")
                sent += 1
        return sent

    try:
        with trio.fail_after(90):
            async with run_daemon(config) as daemon:
                await daemon.wait_log("listening for desired-state notifications")
                await daemon.wait_log("published")
                before = _attempts(await scrape(port))
                storm_s = 3.0
                sent = await trio.to_thread.run_sync(notify_storm, storm_s)
                await daemon.wait_log("notification storm began")
                after = await scrape(port)
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")
    attempts = _attempts(after) - before
    assert sent > 200, sent  # a storm: hundreds of notifications
    assert attempts <= storm_s / 0.25 + 3, (attempts, sent)
    assert _held(after) >= 1


def _received(metrics: str) -> float:
    return metric_sum(metrics, "supervisor_listen_notifications_total") or 0.0


async def test_the_listener_keeps_reading_while_wake_ups_are_held(
    tmp_path: Path, pg_url: str
) -> None:
    """Held wake-ups must not slow the reading: a LISTEN session that falls behind
    keeps the server's notification queue from being truncated, and once that queue
    is full every NOTIFY of the cluster fails (publish's among them). 8,000 large
    notifications sent as fast as the server takes them are all read soon after."""


    port = free_port()
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=3600)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    total = 8000

    def flood() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for start in range(0, total, 100):
                conn.execute("SELECT pg_notify('supervisor_desired', repeat('x', 7990) || g) "
                             "FROM generate_series(%s::int, %s::int) g", (start, start + 99))

    with trio.fail_after(90):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("listening for desired-state notifications")
            await daemon.wait_log("published")
            await trio.to_thread.run_sync(flood)

            async def all_received() -> bool:
                return _received(await scrape(port)) >= total

            with trio.move_on_after(20):  # then the assertion below says how many came
                await poll_until(all_received)
            received = _received(await scrape(port))
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    assert received >= total, received


def _cpu_s(pid: int) -> float:
    """The process's user + system CPU time so far (/proc/PID/stat fields 14 and 15)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_notifications_against_an_unchanged_large_revision_cost_no_more_than_a_small_one(
    tmp_path: Path, pg_url: str
) -> None:
    """Observe decides: a wake-up that finds the active id and digest hydrates nothing, so
    ten seconds of NOTIFY cost the same against 12 MB as against one alias (within 1.5x)."""
    import time

    from tests.memorydrills import big_body

    config = write_config(tmp_path, pg_url, poll_interval_s=3600)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    large = tmp_path / "large.json"
    large.write_bytes(big_body(12_000_000))

    def notify(for_s: float) -> int:
        # Paced just past the wake-up floor (0.05 s): each notification is one wake-up,
        # as a publisher's would be; a flat-out storm measures the floor instead.
        sent = 0
        with psycopg.connect(pg_url, autocommit=True) as conn:
            end = time.monotonic() + for_s
            while time.monotonic() < end:
                conn.execute("SELECT pg_notify('supervisor_desired', '1')")
                sent += 1
                time.sleep(0.06)
        return sent

    async def cost(daemon_pid: int) -> float:
        before = _cpu_s(daemon_pid)
        assert await trio.to_thread.run_sync(notify, 10.0) > 100
        return _cpu_s(daemon_pid) - before

    with trio.fail_after(180):
        async with run_daemon(config, env={"TSUP_TEST_NEVER_SET": "s" * 32}) as daemon:
            await daemon.wait_log("listening for desired-state notifications")
            await daemon.wait_log("published")
            small = await cost(daemon.process.pid)
            await acli("publish", "--config", str(config), str(large))
            await daemon.wait_log("published", revision=2)
            big = await cost(daemon.process.pid)
    assert big <= 1.5 * small, f"{big:.2f} s CPU against 12 MB, {small:.2f} s against one alias"
