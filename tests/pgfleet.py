"""A real PostgreSQL hot standby and a real PgBouncer for the fleet tests.

Both are started as the ``postgres`` OS user (neither runs as root) and are
always stopped when the context manager exits, whatever the test did.

The hot standby (:func:`hot_standby`) is a second cluster made from the primary
on 127.0.0.1:5432 with ``pg_basebackup -R`` and started with ``pg_ctl`` on a
free port. The primary must accept replication connections from loopback with
trust auth: :func:`ensure_replication_hba` appends the line
``host replication all 127.0.0.1/32 trust`` to the primary's ``pg_hba.conf``
when no such line is there yet (idempotent) and reloads the primary's
configuration. This edits the machine's PostgreSQL configuration, once, on
purpose (.ci/run says so too).

PgBouncer (:func:`pgbouncer`) is Debian's package, in transaction pooling mode,
with one server connection per pool (``default_pool_size = 1``): every client
of a database shares one server session, so any session state a client relies
on would leak to (or be lost for) the next client, which the tests observe.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests.conftest import ADMIN_DSN
from tests.proc import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
REPLICATION_HBA = "host replication all 127.0.0.1/32 trust"
START_TIMEOUT_S = 60


def _as_postgres(*argv: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                            check=False, **_postgres_user())
    if result.returncode != 0:
        raise AssertionError(f"{argv[0]} exited {result.returncode}: {result.stderr}")
    return result


def _postgres_user() -> dict[str, str]:
    # Neither PostgreSQL nor PgBouncer runs as root.
    return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}


def _postgres_dir(prefix: str) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    directory.chmod(0o700)
    return directory


def ensure_replication_hba() -> None:
    """Allow trust replication from loopback on the primary (idempotent; reloads)."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        row = conn.execute("SHOW hba_file").fetchone()
        assert row is not None
        hba = Path(str(row[0]))
        lines = [" ".join(line.split()) for line in hba.read_text().splitlines()]
        if REPLICATION_HBA not in lines:
            with hba.open("a") as f:
                f.write(f"\n# added by trio-supervisor's fleet tests\n{REPLICATION_HBA}\n")
            conn.execute("SELECT pg_reload_conf()")


@contextmanager
def hot_standby() -> Iterator[str]:
    """A running hot standby of the primary; yields its maintenance DSN. Stopped on exit."""
    ensure_replication_hba()
    root = _postgres_dir("tsup-standby-")
    data = root / "data"
    port = free_port()
    started = False
    try:
        _as_postgres(str(PG_BIN / "pg_basebackup"), "-R", "-X", "stream", "-c", "fast",
                     "-D", str(data), "-h", "127.0.0.1", "-p", "5432", "-U", "postgres")
        # Debian keeps the configuration in /etc: the copy has none of its own.
        (data / "postgresql.conf").write_text(
            f"port = {port}\nlisten_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{root}'\nhot_standby = on\n"
            "shared_buffers = 16MB\nfsync = off\n"
            "cluster_name = 'tsup-standby'\n"
        )
        (data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
        (data / "pg_ident.conf").write_text("")
        for name in ("postgresql.conf", "pg_hba.conf", "pg_ident.conf"):
            if os.geteuid() == 0:
                shutil.chown(data / name, "postgres", "postgres")
        try:
            _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(root / "log"),
                         "-w", "-t", str(START_TIMEOUT_S), "start")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{(root / 'log').read_text()}") from None
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                         "stop")
        shutil.rmtree(root, ignore_errors=True)


def wait_replayed(primary_dsn: str, standby_dsn: str, timeout_s: float = 30) -> None:
    """Block until the standby has replayed everything the primary had written when called."""
    with psycopg.connect(primary_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        target = str(row[0])
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(standby_dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]).fetchone()
            if row is not None and row[0]:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"standby did not replay up to {target} in {timeout_s} s")
            time.sleep(0.02)


@contextmanager
def pgbouncer() -> Iterator[int]:
    """PgBouncer in transaction pooling mode in front of the primary; yields its port."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    root = _postgres_dir("tsup-pgbouncer-")
    port = free_port()
    (root / "userlist.txt").write_text('"postgres" ""\n')
    ini = root / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n* = host=127.0.0.1 port=5432\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root}/userlist.txt\n"
        "pool_mode = transaction\ndefault_pool_size = 1\nmax_client_conn = 200\n"
        "server_reset_query =\nignore_startup_parameters = extra_float_digits\n"
        f"logfile = {root}/pgbouncer.log\n"
    )
    for name in ("userlist.txt", "pgbouncer.ini"):
        if os.geteuid() == 0:
            shutil.chown(root / name, "postgres", "postgres")
    process = subprocess.Popen([binary, str(ini)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, cwd=root, **_postgres_user())
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres",
                                     connect_timeout=2, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("pgbouncer did not start: "
                                         + (root / "pgbouncer.log").read_text()) from None
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)
