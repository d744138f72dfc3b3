"""Memory after refusals, through the real daemon process.

A refused candidate of any size must leave nothing behind: ten refusals of a
16 MB body (as in the finding: a missing ``env:`` secret, retried every poll) keep the daemon's
peak RSS within 1.5x of what it was after the first.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import psycopg
import pytest
import trio

from tests.memorydrills import big_body, failures
from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config

pytestmark = pytest.mark.slow


def rss_bytes(pid: int, field: str = "VmHWM") -> int:
    """The process's peak (VmHWM) or current (VmRSS) resident set, in bytes.

    The peak is what the comparison uses: every poll re-compiles the refused
    body, so the current RSS depends on where in a compile it is sampled; a
    leak raises the peak with every refusal, a transient working set does not.
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


@pytest.mark.chaos  # over 10 s through the real process: run by CI's `pytest -m chaos`
async def test_ten_refusals_of_a_large_body_leave_no_memory_behind(
    tmp_path: Path, pg_url: str
) -> None:
    port = free_port()
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=0.2, listen=False)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    body = big_body(16_100_000)  # 16.1 MB: the finding's 16 MB, under the 16 MiB limit
    assert 16_000_000 <= len(body) < 16 * 1024 * 1024
    with trio.fail_after(240):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            baseline = rss_bytes(daemon.process.pid)

            def insert() -> None:
                with psycopg.connect(pg_url) as conn:
                    rid = conn.execute(
                        "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                        " VALUES (1, %s, sha256(%s)) RETURNING id", (body, body)).fetchone()[0]
                    conn.execute("UPDATE supervisor_desired SET revision_id = %s", (rid,))

            await trio.to_thread.run_sync(insert)
            await daemon.wait_log("revision refused; previous snapshot keeps serving",
                                  reason="secret")

            async def refused(n: int) -> bool:
                return await failures(port) >= n

            await poll_until(lambda: refused(1))
            after_first = rss_bytes(daemon.process.pid)
            await poll_until(lambda: refused(10))
            after_ten = rss_bytes(daemon.process.pid)
            current = rss_bytes(daemon.process.pid, "VmRSS")
            mib = 1024 * 1024
            # A body kept per refusal (the defect this pins) adds 16 MB a refusal: nine
            # more put the peak far past twice the first; two attempts' bodies alive at
            # once on a loaded machine (an abandoned compile beside the next read) do not.
            assert after_ten <= 2.0 * after_first, (
                f"peak RSS grew from {after_first / mib:.0f} MiB after one refusal to "
                f"{after_ten / mib:.0f} MiB after ten (current {current / mib:.0f} MiB, "
                f"baseline {baseline / mib:.0f} MiB, body {len(body) / mib:.1f} MiB)")
            # Still serving the previous snapshot.
            async with httpx.AsyncClient(timeout=10.0) as client:
                snap = (await client.get(f"http://127.0.0.1:{port}/v1/snapshot")).json()
            assert snap["revision"] == 1


async def test_a_huge_message_is_read_cut_and_costs_the_daemon_no_memory(
    tmp_path: Path, pg_url: str
) -> None:
    """A writer gives a revision a 160 MiB message (made by the server): hydrate reads its
    first 4 KiB and its length, so the daemon's peak RSS does not move by the message."""
    port = free_port()
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=0.2, listen=False)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    mib = 1024 * 1024
    with trio.fail_after(120):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            baseline = rss_bytes(daemon.process.pid)

            def insert() -> int:
                with psycopg.connect(pg_url) as conn:
                    rid = conn.execute(
                        "INSERT INTO supervisor_revisions (schema_version, body, body_sha256,"
                        " message) SELECT schema_version, body, body_sha256,"
                        " repeat('x', 160 * 1024 * 1024) FROM supervisor_revisions"
                        " WHERE id = 1 RETURNING id").fetchone()[0]
                    conn.execute("UPDATE supervisor_desired SET revision_id = %s", (rid,))
                return int(rid)

            rid = await trio.to_thread.run_sync(insert)
            await daemon.wait_log("published", revision=rid)
            peak = rss_bytes(daemon.process.pid)
            assert peak < baseline + 32 * mib, (
                f"peak RSS {peak / mib:.0f} MiB after hydrating a 160 MiB message "
                f"(baseline {baseline / mib:.0f} MiB)")
