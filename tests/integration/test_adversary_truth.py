"""Adversary drills (issues 10, 17, 18): /status and metrics against what is served.

Each test is a fault the issues did not list, through the real daemon process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from tests.polling import poll_until
from tests.proc import acli, free_port, run_daemon, write_config


def body(*aliases: str, **extra: Any) -> bytes:
    return json.dumps({"schema_version": 1, "aliases": {
        a: {"upstream": f"https://{a}.example/v1", **extra} for a in aliases}}).encode()


async def get(port: int, path: str) -> Any:
    async with httpx.AsyncClient(timeout=5.0) as client:
        return (await client.get(f"http://127.0.0.1:{port}{path}")).json()


async def metric(port: int, name: str) -> float:
    async with httpx.AsyncClient(timeout=5.0) as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def publish_sql(conn: psycopg.Connection[Any], data: bytes) -> int:
    row = conn.execute(
        "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
        " VALUES (1, %s, sha256(%s)) RETURNING id", (data, data)).fetchone()
    assert row is not None
    conn.execute(
        "INSERT INTO supervisor_desired (singleton, revision_id) VALUES (true, %s)"
        " ON CONFLICT (singleton) DO UPDATE SET revision_id = excluded.revision_id",
        (row[0],))
    return int(row[0])


async def test_reused_id_with_a_refused_body_is_not_reported_converged(
        tmp_path: Path, pg_url: str) -> None:
    """A restore reuses the served id 3 for a body that is refused (validation).

    Expected: the replica keeps serving the old body (right) and says it is not
    converged: lag grows, desired != served content. Seen: desired == active == 3,
    lag_s 0 and supervisor_convergence_lag_seconds 0 for ever, so the paging alert
    (lag > 300 s) never fires; the rejection counter stops rising after the first
    refusal (memo), so the ticket alert stops after 15 minutes too.
    """
    port = free_port()
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=0.2)
    await acli("db", "migrate", "--config", str(config))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for _ in range(3):
            publish_sql(conn, body("a0", "a1"))
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=3)
            with psycopg.connect(pg_url) as conn:  # a restore, then a bad publish
                conn.execute("UPDATE supervisor_desired SET revision_id = 1")
                conn.execute("DELETE FROM supervisor_revisions WHERE id > 1")
                conn.execute("ALTER TABLE supervisor_revisions ALTER id RESTART WITH 2")
                publish_sql(conn, body("b"))
                assert publish_sql(conn, body("a0", retries=99)) == 3  # retries 0..10
            await daemon.wait_log("revision refused; previous snapshot keeps serving",
                                  revision=3, reason="validation")
            # Several more polls: the memo answers them.
            async def polls_done() -> bool:
                return await metric(port, "supervisor_convergence_attempts_total"
                                    '{outcome="rejected"}') >= 5

            await poll_until(polls_done)
            snap = await get(port, "/v1/snapshot")
            assert sorted(snap["aliases"]) == ["a0", "a1"]  # the old body serves
            report = (await get(port, "/status"))["revision"]
            lag_metric = await metric(port, "supervisor_convergence_lag_seconds")
            assert report["lag_s"] > 0 and lag_metric > 0, (
                f"serving the old body of revision 3 while desired is a different body "
                f"under id 3, yet /status says desired={report['desired']} "
                f"active={report['active']} lag_s={report['lag_s']} and "
                f"supervisor_convergence_lag_seconds={lag_metric}")


async def test_desired_pointer_gone_while_serving_is_told(tmp_path: Path) -> None:
    """The desired row vanishes (a restore into a fresh file, ``DELETE FROM supervisor_desired``).

    At boot this is a refusal ("empty", exit 3). While running, nothing says so:
    no log line, ``consecutive_failures`` 0, ``last_error`` null, /healthz 200;
    only ``desired`` turns null and the lag starts to grow. Expected: a log line
    (once) and ``last_error`` naming it, like every other way desired state can
    stop being servable.
    """
    import sqlite3

    from tests.proc import EXAMPLE

    port = free_port()
    cp = tmp_path / "cp.db"
    config = write_config(tmp_path, f"sqlite:///{cp}", port=port, poll_interval_s=0.2)
    await acli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            start = len(daemon.lines)
            with sqlite3.connect(cp) as conn:
                conn.execute("DELETE FROM supervisor_desired")

            async def seen_empty() -> bool:
                return await metric(port, 'supervisor_convergence_attempts_total'
                                          '{outcome="empty"}') >= 5

            await poll_until(seen_empty)
            report = (await get(port, "/status"))["revision"]
            assert report["desired"] is None
            told = [line for line in daemon.lines[start:]
                    if line.get("level") in ("warning", "error")]
            assert told or report["last_error"] is not None, (
                f"desired state vanished while serving revision {report['active']}: no "
                f"warning logged, last_error={report['last_error']!r}, "
                f"consecutive_failures={report['consecutive_failures']}")
