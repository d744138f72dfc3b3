"""Never report converged while serving the wrong revision, through the real process.

- An id reused after a restore (PostgreSQL; SQLite in place, and by a file whose
  desired id is the one served with another body): the new body is published.
- An id reused for a body that is refused: not converged (lag grows, desired and
  served content differ), and the metrics say so.
- The desired pointer removed while serving: told in /status and the log.
- The SQLite control-plane file replaced (``mv new.db cp.db``) or deleted at runtime.
- LISTEN reconnects within a second of the control plane's recovery.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from tests.health import metric
from tests.polling import poll_until
from tests.postgres import body, publish_sql
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config
from tests.tcpproxy import pg_proxy, proxied_url


async def get(port: int, path: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5.0) as client:
        return dict((await client.get(f"http://127.0.0.1:{port}{path}")).json())


REUSED = ("revision id reused with different content (a restore followed by new "
          "publishes?): treating it as a new revision")


async def pg_at_revision_3(tmp_path: Path, pg_url: str, poll_interval_s: float) -> tuple[int, Path]:
    """A migrated PostgreSQL control plane with three publishes of a0, a1: the port and config."""
    port = free_port()
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=poll_interval_s)
    await acli("db", "migrate", "--config", str(config))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for _ in range(3):
            publish_sql(conn, body("a0", "a1"))
    return port, config


def restore_pg_to_revision_1(conn: psycopg.Connection[Any]) -> None:
    """Back to revision 1 with the id sequence reset, then a publish of b (id 2)."""
    conn.execute("UPDATE supervisor_desired SET revision_id = 1")
    conn.execute("DELETE FROM supervisor_revisions WHERE id > 1")
    conn.execute("ALTER TABLE supervisor_revisions ALTER id RESTART WITH 2")
    publish_sql(conn, body("b"))


def sqlite_config(tmp_path: Path) -> tuple[int, Path, Path]:
    """The daemon's port, its control-plane file and its config (polling every 0.2 s)."""
    port = free_port()
    cp = tmp_path / "cp.db"
    return port, cp, write_config(tmp_path, f"sqlite:///{cp}", port=port, poll_interval_s=0.2)


def other_sqlite_config(tmp_path: Path) -> Path:
    """The config of the file to restore from, other/new.db, made beside cp.db."""
    other = tmp_path / "other"
    other.mkdir()
    return write_config(other, f"sqlite:///{other / 'new.db'}")


async def test_id_reused_after_a_restore_is_published(tmp_path: Path, pg_url: str) -> None:
    port, config = await pg_at_revision_3(tmp_path, pg_url, poll_interval_s=0.3)
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=3)
            with psycopg.connect(pg_url) as conn:  # one transaction, as a restore script
                restore_pg_to_revision_1(conn)
                assert publish_sql(conn, body(*[f"a{i}" for i in range(7)])) == 3
            await daemon.wait_log(REUSED, revision=3)
            await daemon.wait_log("published", revision=3, generation=2)
            snap = await get(port, "/v1/snapshot")
            assert sorted(snap["aliases"]) == [f"a{i}" for i in range(7)]
            report = (await get(port, "/status"))["revision"]
            assert report["desired"] == report["active"] == 3 and report["lag_s"] == 0.0


def publish_sqlite(conn: sqlite3.Connection, data: bytes) -> int:
    rid = conn.execute(
        "INSERT INTO supervisor_revisions (schema_version, body, body_sha256) VALUES (1, ?, ?)",
        (data, hashlib.sha256(data).digest())).lastrowid
    assert rid is not None
    conn.execute("INSERT INTO supervisor_desired (singleton, revision_id) VALUES (1, ?)"
                 " ON CONFLICT (singleton) DO UPDATE SET revision_id = excluded.revision_id",
                 (rid,))
    return rid


async def test_id_reused_on_sqlite_in_place_and_by_a_restored_file(tmp_path: Path) -> None:
    port, db, config = sqlite_config(tmp_path)
    await acli("db", "migrate", "--config", str(config))
    with closing(sqlite3.connect(db)) as conn, conn:
        for _ in range(3):
            publish_sqlite(conn, body("a0", "a1"))
    # The restored file: desired is revision 3 too, with another body.
    other_config = other_sqlite_config(tmp_path)
    new_db = other_config.parent / "new.db"
    await acli("db", "migrate", "--config", str(other_config))
    # Closed (not only committed): the last connection checkpoints the WAL into
    # the file, so `mv new.db` moves every revision.
    with closing(sqlite3.connect(new_db)) as conn, conn:
        for n in range(3):
            publish_sqlite(conn, body(f"f{n}"))
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=3)
            with closing(sqlite3.connect(db)) as conn, conn:  # one transaction, as a restore
                conn.execute("UPDATE supervisor_desired SET revision_id = 1")
                conn.execute("DELETE FROM supervisor_revisions WHERE id > 1")
                conn.execute("UPDATE sqlite_sequence SET seq = 1"
                             " WHERE name = 'supervisor_revisions'")
                publish_sqlite(conn, body("b"))
                assert publish_sqlite(conn, body(*[f"a{i}" for i in range(7)])) == 3
            await daemon.wait_log(REUSED, revision=3)
            await daemon.wait_log("published", revision=3, generation=2)
            assert sorted((await get(port, "/v1/snapshot"))["aliases"]) == [
                f"a{i}" for i in range(7)]
            os.replace(new_db, db)  # mv new.db cp.db: desired 3 again, other body
            await daemon.wait_log("published", revision=3, generation=3)
            assert sorted((await get(port, "/v1/snapshot"))["aliases"]) == ["f2"]
            report = (await get(port, "/status"))["revision"]
            assert report["desired"] == report["active"] == 3 and report["lag_s"] == 0.0


async def test_sqlite_file_replaced_or_deleted_at_runtime(tmp_path: Path) -> None:
    port, cp, config = sqlite_config(tmp_path)
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    # The "restore": another file with more revisions, made beside it.
    other_config = other_sqlite_config(tmp_path)
    for _ in range(3):
        await acli("publish", "--config", str(other_config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            os.replace(other_config.parent / "new.db", cp)  # mv new.db cp.db
            await daemon.wait_log("control-plane file replaced or removed; reopening")
            await daemon.wait_log("published", revision=3)
            fds = [os.readlink(f"/proc/{daemon.process.pid}/fd/{fd}")
                   for fd in os.listdir(f"/proc/{daemon.process.pid}/fd")]
            assert not [fd for fd in fds if fd.endswith("(deleted)")], fds
            # Deleted: an outage, not an empty control plane, and not "converged".
            saved = tmp_path / "saved.db"
            shutil.copy(cp, saved)
            cp.unlink()
            await daemon.wait_log("control plane unreachable", reason="unavailable")

            async def down() -> bool:
                return (await get(port, "/status"))["revision"]["control_plane_up"] is False

            await poll_until(down)
            # Re-created with a newer desired revision: noticed without a restart.
            shutil.copy(saved, cp)
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            await daemon.wait_log("control plane reachable again")
            await daemon.wait_log("published", revision=4)
            report = (await get(port, "/status"))["revision"]
            assert report["desired"] == report["active"] == 4


async def test_listen_reconnects_within_a_second_of_recovery(tmp_path: Path,
                                                             pg_url: str) -> None:
    config = write_config(tmp_path, pg_url)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    port = free_port()
    with trio.fail_after(120):
        async with pg_proxy(free_port(), pg_url) as proxy:
            proxied = write_config(tmp_path, proxied_url(pg_url, proxy.port), port=port,
                                   poll_interval_s=1.0, listen=True,
                                   backoff_initial_s=1.0, backoff_max_s=30.0)
            async with run_daemon(proxied) as daemon:
                await daemon.wait_log("ready")
                await daemon.wait_log("listening for desired-state notifications")
                proxy.stop()
                await daemon.wait_log("LISTEN connection unreachable")
                await daemon.wait_log("control plane unreachable")

                # Until the LISTEN backoff has grown to several seconds.
                async def backed_off() -> bool:
                    return await metric(port, "supervisor_listen_reconnects_total") >= 4

                await poll_until(backed_off)
                start = len(daemon.lines)
                await proxy.start()
                # The loop retries now (its own backoff is as long as the listener's):
                # only the loop's poke can make the listener reconnect before its
                # 4-8 s backoff sleep ends.
                daemon.signal(signal.SIGHUP)
                back = await daemon.wait_log("control plane reachable again")
                listening = await daemon.wait_log("LISTEN connection reachable again")
                assert daemon.lines.index(listening) >= start
                took = _ts(listening) - _ts(back)
                assert took < 1.0, f"LISTEN reconnected {took:.2f} s after recovery"
                # And it works: a publish converges through it (poll is 1 s; the
                # wake-up makes it far sooner, but correctness is what is checked).
                await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
                await daemon.wait_log("published", revision=2)


def _ts(line: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()


async def test_reused_id_with_a_refused_body_is_not_reported_converged(
        tmp_path: Path, pg_url: str) -> None:
    """A restore reuses the served id 3 for a body that is refused (validation).

    The replica keeps serving the old body and says it is not converged: lag
    grows, desired != served content, and supervisor_convergence_lag_seconds grows
    too, so the paging alert (lag > 300 s) fires; the rejection counter keeps
    rising past the first refusal (memo), so the ticket alert holds.
    """
    port, config = await pg_at_revision_3(tmp_path, pg_url, poll_interval_s=0.2)
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=3)
            with psycopg.connect(pg_url) as conn:  # a restore, then a bad publish
                restore_pg_to_revision_1(conn)
                assert publish_sql(conn, body("a0", retries=99)) == 3  # retries 0..10
            await daemon.wait_log("revision refused; previous snapshot keeps serving",
                                  revision=3, reason="validation")
            # Several more polls: the memo answers them.
            async def polls_done() -> bool:
                return await metric(port, "supervisor_convergence_attempts_total",
                                    outcome="rejected") >= 5

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
    port, cp, config = sqlite_config(tmp_path)
    await acli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            start = len(daemon.lines)
            with sqlite3.connect(cp) as conn:
                conn.execute("DELETE FROM supervisor_desired")

            async def seen_empty() -> bool:
                return await metric(port, "supervisor_convergence_attempts_total",
                                    outcome="empty") >= 5

            await poll_until(seen_empty)
            report = (await get(port, "/status"))["revision"]
            assert report["desired"] is None
            told = [line for line in daemon.lines[start:]
                    if line.get("level") in ("warning", "error")]
            assert told or report["last_error"] is not None, (
                f"desired state vanished while serving revision {report['active']}: no "
                f"warning logged, last_error={report['last_error']!r}, "
                f"consecutive_failures={report['consecutive_failures']}")
