"""A database that accepts connections and never answers: what it may cost (real process).

Between the daemon and PostgreSQL sits a proxy that lets each session's startup
through and then holds every query (the kernel still ACKs: keepalives never
trip). Each attempt ends at ``read_timeout_s``; the abandoned call's socket is
shut down, so its worker thread returns and its descriptor closes. Threads and
descriptors stay flat past trio's shared limit of 40 threads, and once the
database answers again a new revision is served within one poll.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio

from tests.health import status
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config
from tests.tcpproxy import pg_proxy, proxied_url

POLL_S = 1.0
READ_TIMEOUT_S = 0.5


def _count(pid: int, what: str) -> int:
    return len(os.listdir(f"/proc/{pid}/{what}"))



async def test_a_database_that_never_answers_leaves_no_thread_or_descriptor_behind(
    tmp_path: Path, pg_url: str
) -> None:
    direct = write_config(tmp_path, pg_url)
    await acli("db", "migrate", "--config", str(direct))
    await acli("publish", "--config", str(direct), str(EXAMPLE))
    proxy_port, admin_port = free_port(), free_port()
    daemon_dir = tmp_path / "daemon"
    daemon_dir.mkdir()
    config = write_config(
        daemon_dir, proxied_url(pg_url, proxy_port), port=admin_port, poll_interval_s=POLL_S,
        listen=False, backoff_initial_s=0.05, backoff_max_s=0.1,
        control_plane_extra=f"read_timeout_s = {READ_TIMEOUT_S}")
    with trio.fail_after(240):
        async with pg_proxy(proxy_port, pg_url) as proxy, run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            pid = daemon.process.pid
            threads, fds = _count(pid, "task"), _count(pid, "fd")
            proxy.stalled = True
            peak_threads = peak_fds = 0
            failures = 0
            while failures < 50:  # past trio's default limiter of 40 threads
                await trio.sleep(0.5)
                peak_threads = max(peak_threads, _count(pid, "task"))
                peak_fds = max(peak_fds, _count(pid, "fd"))
                failures = (await status(admin_port))["revision"]["consecutive_failures"]
            doc = await status(admin_port)
            assert "timed out after 0.5 s" in (doc["revision"]["last_error"] or "")
            assert doc["revision"]["control_plane_up"] is False
            # A few threads in flight (a call, its interrupt, trio's idle cache),
            # never one per abandoned call.
            assert peak_threads <= threads + 6, (threads, peak_threads)
            assert peak_fds <= fds + 6, (fds, peak_fds)
            await acli("publish", "--config", str(direct), str(EXAMPLE), "--force")
            healed = trio.current_time()
            proxy.stalled = False
            await daemon.wait_log("published", revision=2)
            assert trio.current_time() - healed <= POLL_S + READ_TIMEOUT_S + 1.0
            assert _count(pid, "fd") <= fds + 2
