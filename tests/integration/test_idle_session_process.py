"""A connection the server closes while idle is replaced without an outage (real process).

``idle_session_timeout`` below the poll interval (or a pooler's idle limit)
closes the store's connection between two polls and the LISTEN session while
it waits. Each poll must then reconnect within its own attempt, and neither
the convergence loop nor the LISTEN child may log an outage that is not one.
"""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from tests.pgfaults import alter_database
from tests.proc import EXAMPLE, acli, run_daemon, write_config

POLLS = 5


async def test_idle_session_timeout_below_the_poll_interval_logs_no_outage(
    tmp_path: Path, pg_url: str
) -> None:
    config = write_config(tmp_path, pg_url, poll_interval_s=0.5)
    config.write_text(config.read_text().replace('level = "info"', 'level = "debug"'))
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    await alter_database(pg_url, "idle_session_timeout", "200ms")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            # Each poll comes after the server has closed the idle connection.
            attempts = await daemon.wait_logs("convergence attempt", POLLS, trigger="poll")
            assert [line["outcome"] for line in attempts] == ["converged"] * POLLS
            # Still converging: a publish arrives (by NOTIFY or the next poll).
            await acli("publish", "--config", str(config), "--force", str(EXAMPLE))
            await daemon.wait_log("published", revision=2)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    events = [str(line.get("event", "")) for line in daemon.lines]
    # The fault happened: the server did close the store's idle connection.
    assert "control-plane connection closed while idle; reconnecting" in events
    assert not [e for e in events if "unreachable" in e], "\n".join(events)
    assert events.count("listening for desired-state notifications") == 1, events
