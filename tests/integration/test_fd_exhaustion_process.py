"""Exhausted descriptors while resolving a secret are transient, real process.

The running daemon's descriptor limit is lowered with ``prlimit`` to exactly
what it holds, so the next ``open()`` fails with EMFILE, the way a connection
flood leaves a process. A revision whose key is a ``file:`` secret is then made
desired: it must be refused as ``unavailable`` (retried with backoff), never as
the permanent-looking ``secret``, and it converges once descriptors are back.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
import trio

from tests import needs
from tests.proc import EXAMPLE, acli, run_daemon, write_config


@pytest.fixture(autouse=True)
def _prlimit() -> None:
    needs.program("prlimit", "apt-get install util-linux")


def set_soft_nofile(pid: int, soft: int | str, hard: str) -> None:
    # Only the soft limit moves: raising a hard limit back needs more than root here.
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:{hard}"], check=True)


async def test_emfile_on_a_secret_file_is_unavailable_not_secret(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    config = write_config(tmp_path, f"sqlite:///{db}", poll_interval_s=0.2,
                          backoff_initial_s=0.2, backoff_max_s=1.0)
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    secret = tmp_path / "team.key"
    secret.write_text("s3cret\n")
    body = json.dumps({
        "schema_version": 1,
        "aliases": {"chat": {"upstream": "https://chat.example/v1"}},
        "keys": {"team": {"secret": f"file:{secret}", "aliases": ["chat"]}},
    }).encode()
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            pid = daemon.process.pid
            held = len(os.listdir(f"/proc/{pid}/fd"))
            original = subprocess.run(["prlimit", f"--pid={pid}", "--nofile", "--raw",
                                       "--noheadings", "--output=SOFT,HARD"],
                                      capture_output=True, text=True, check=True).stdout.split()
            set_soft_nofile(pid, held, original[1])
            with sqlite3.connect(db) as conn:
                rid = conn.execute(
                    "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                    " VALUES (1, ?, ?)", (body, hashlib.sha256(body).digest())).lastrowid
                conn.execute("UPDATE supervisor_desired SET revision_id = ?", (rid,))
            line = await daemon.wait_log("revision refused; previous snapshot keeps serving",
                                         revision=rid)
            assert line["reason"] == "unavailable", line
            assert "Too many open files" in line["detail"]
            assert line["retry_in_s"] <= 1.0  # backed off, not the poll of a refusal
            set_soft_nofile(pid, original[0], original[1])
            await daemon.wait_log("published", revision=rid)
            assert not [x for x in daemon.lines
                        if x.get("reason") == "secret" and x.get("revision") == rid]


async def test_accept_out_of_descriptors_is_logged_once_per_streak(tmp_path: Path) -> None:
    """The admin listener out of descriptors: one warning when the
    streak begins, one with the count when it ends, never a line per retry; clients
    are refused meanwhile (reset, not left in the backlog), and served once it ends."""
    from tests.floods import connect, request
    from tests.polling import poll_until

    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    port = int(config.read_text().split('listen = "127.0.0.1:')[1].split('"')[0])
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            pid = daemon.process.pid
            original = subprocess.run(["prlimit", f"--pid={pid}", "--nofile", "--raw",
                                       "--noheadings", "--output=SOFT,HARD"],
                                      capture_output=True, text=True, check=True).stdout.split()
            set_soft_nofile(pid, len(os.listdir(f"/proc/{pid}/fd")), original[1])
            answered = 0
            for _ in range(20):  # over about 2 s: many retries of the accept loop
                try:
                    stream = await connect(port)
                    await stream.send_all(b"GET /status HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    with trio.move_on_after(0.1):
                        answered += bool(await stream.receive_some(100))
                    await stream.aclose()
                except (OSError, trio.BrokenResourceError):
                    pass  # refused: reset
            set_soft_nofile(pid, original[0], original[1])

            async def served_and_recovered() -> bool:
                # The streak ends at the first success 1 s after the last failure.
                served = (await request(port, "/status"))[0] == 200
                return served and any(x.get("event") == "admin accept recovered"
                                      for x in daemon.lines)

            await poll_until(served_and_recovered)
            recovered = await daemon.wait_log("admin accept recovered")
            assert answered == 0
    failing = [x for x in daemon.lines if x.get("event") == "admin accept failing"]
    assert len(failing) == 1 and failing[0]["error"] == "EMFILE", failing
    assert recovered["count"] >= 10  # each retry counted, none logged on its own
    assert len([x for x in daemon.lines if x.get("event") == "admin accept recovered"]) == 1
