"""A real PostgreSQL hot standby and a real PgBouncer for the fleet tests.

Both run as the unprivileged user of tests/pgserver.py (neither runs as root) and are
always stopped when the context manager exits, whatever the test did.

The hot standby (:func:`hot_standby`) is a second cluster made from the run's server
(the ``pg_server`` fixture) with ``pg_basebackup -R`` and started with ``pg_ctl`` on a
free port, both of the server's own major version: the suite's own binaries when it
started its own server, Debian's /usr/lib/postgresql/N/bin for a system server. The
primary must accept replication connections from loopback with trust auth: the suite's
own server does from the start; for a system server :func:`ensure_replication_hba`
appends the line ``host replication all 127.0.0.1/32 trust`` to its ``pg_hba.conf``
when no such line is there yet (idempotent) and reloads its configuration. This edits
the machine's PostgreSQL configuration, once, on purpose (.ci/run says so too).

PgBouncer (:func:`pgbouncer`) is Debian's package, in transaction pooling mode,
with one server connection per pool (``default_pool_size = 1``): every client
of a database shares one server session, so any session state a client relies
on would leak to (or be lost for) the next client, which the tests observe.
Without it the tests skip, naming it (tests/needs.py).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests import needs
from tests.pgserver import START_TIMEOUT_S, Server, give, own_dir, run_as_server_user, unprivileged
from tests.proc import free_port

REPLICATION_HBA = "host replication all 127.0.0.1/32 trust"
PGBOUNCER_HOW = "apt-get install pgbouncer; .ci/run installs it"


def ensure_replication_hba(server: Server) -> None:
    """Allow trust replication from loopback on the primary (idempotent; reloads)."""
    with server.admin() as conn:
        row = conn.execute("SHOW hba_file").fetchone()
        assert row is not None
        hba = Path(str(row[0]))
        lines = [" ".join(line.split()) for line in hba.read_text().splitlines()]
        if REPLICATION_HBA not in lines:
            with hba.open("a") as f:
                f.write(f"\n# added by trio-supervisor's fleet tests\n{REPLICATION_HBA}\n")
            conn.execute("SELECT pg_reload_conf()")


@contextmanager
def hot_standby(server: Server) -> Iterator[str]:
    """A running hot standby of ``server``; yields its maintenance DSN. Stopped on exit."""
    pg_basebackup, pg_ctl = server.program("pg_basebackup"), server.program("pg_ctl")
    ensure_replication_hba(server)
    root = own_dir("tsup-standby-")
    data = root / "data"
    port = free_port()
    started = False
    try:
        run_as_server_user(pg_basebackup, "-R", "-X", "stream", "-c", "fast", "-D", data,
                           "-h", server.host, "-p", str(server.port), "-U", "postgres")
        # The copy holds no configuration (Debian keeps it in /etc) or the primary's (with
        # the primary's port): the standby gets one of its own.
        (data / "postgresql.conf").write_text(
            f"port = {port}\nlisten_addresses = '127.0.0.1'\n"
            "unix_socket_directories = ''\nhot_standby = on\n"
            "shared_buffers = 16MB\nfsync = off\n"
            "cluster_name = 'tsup-standby'\n"
        )
        (data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
        (data / "pg_ident.conf").write_text("")
        for name in ("postgresql.conf", "pg_hba.conf", "pg_ident.conf"):
            give(data / name)
        try:
            run_as_server_user(pg_ctl, "-D", data, "-l", root / "log", "-w",
                               "-t", str(START_TIMEOUT_S), "start")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{(root / 'log').read_text()}") from None
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            run_as_server_user(pg_ctl, "-D", data, "-m", "immediate", "-w", "stop")
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
def pgbouncer(server: Server) -> Iterator[int]:
    """PgBouncer in transaction pooling mode in front of ``server``; yields its port."""
    # Debian installs it in /usr/sbin, which a user's PATH may lack.
    binary = needs.program("pgbouncer", PGBOUNCER_HOW, also=("/usr/sbin",))
    root = own_dir("tsup-pgbouncer-")
    port = free_port()
    (root / "userlist.txt").write_text('"postgres" ""\n')
    ini = root / "pgbouncer.ini"
    ini.write_text(
        f"[databases]\n* = host={server.host} port={server.port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root}/userlist.txt\n"
        "pool_mode = transaction\ndefault_pool_size = 1\nmax_client_conn = 200\n"
        "server_reset_query =\nignore_startup_parameters = extra_float_digits\n"
        f"logfile = {root}/pgbouncer.log\n"
    )
    for name in ("userlist.txt", "pgbouncer.ini"):
        give(root / name)
    process = subprocess.Popen([binary, str(ini)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, cwd=root, **unprivileged())
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
