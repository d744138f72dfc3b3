"""The PostgreSQL control-plane store, and the psycopg boundary it shares.

:func:`connect`, :func:`bounded` and :func:`classify` serve the LISTEN child and the CLI's
schema probe too. All but the store's own methods block: call them from a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

from supervisor.controlplane import migrations, revisions
from supervisor.controlplane.errors import (
    MIGRATE_HINT,
    ControlPlaneError,
    FailureCategory,
    one_line,
)
from supervisor.controlplane.runner import (
    INTERRUPT_GRACE_S,
    ConnectionRunner,
    StaleConnection,
    dispose_quietly,
)
from supervisor.dsn import redact, scrub
from supervisor.logs import get_logger

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig

__all__ = ["CONNECT_TIMEOUT_S", "SQLSTATE_CLASSES", "SQLSTATE_CODES", "Conn", "PostgresStore",
           "bounded", "call_bounds", "classify", "connect", "dsn_sets_statement_timeout",
           "map_error", "release_socket", "set_session", "timeout_ms"]

log = get_logger("controlplane")

T = TypeVar("T")
Conn = psycopg.Connection[TupleRow]

APPLICATION_NAME = "trio-supervisor"
CONNECT_TIMEOUT_S = 5.0
# Keepalive probes start after 30 s idle, every 10 s, 3 misses: a dead peer is
# noticed within about a minute even on an idle connection; tcp_user_timeout
# bounds unacknowledged writes the same way.
KEEPALIVE = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10",
             "keepalives_count": "3", "tcp_user_timeout": "30000"}

#: The server version that has ``idle_session_timeout``.
IDLE_SESSION_TIMEOUT_SINCE = 140000

# SQLSTATEs that mean "the schema is not there or not current".
_SCHEMA_MISSING = (pgerrors.UndefinedTable, pgerrors.UndefinedColumn, pgerrors.UndefinedFunction)


_U, _C, _I, _D, _X = (FailureCategory.UNAVAILABLE, FailureCategory.CONFLICT,
                      FailureCategory.INVALID, FailureCategory.DENIED, FailureCategory.CORRUPT)

#: SQLSTATE classes (the code's first two characters, PostgreSQL manual
#: appendix A), reviewed one class at a time: the label and why. Every
#: timeout, cancellation, shutdown and resource class is ``unavailable`` (the
#: control plane could not answer; the cache serves, the loop backs off). A
#: class not listed here is the request itself being wrong: ``invalid``.
SQLSTATE_CLASSES: dict[str, tuple[FailureCategory, str]] = {
    "08": (_U, "connection exception: the connection failed or was lost"),
    "25": (_I, "invalid transaction state: a statement sent in the wrong transaction "
               "state is this build's mistake (timeouts and read-only below)"),
    "28": (_D, "invalid authorization: the role or its password was refused"),
    "40": (_C, "transaction rollback (serialization failure, deadlock): contention, "
               "which clears on retry"),
    "42": (_I, "syntax error or access rule violation: the statement or the schema "
               "is wrong (privileges below)"),
    "53": (_U, "insufficient resources (disk full, out of memory, too many "
               "connections): clears when the server recovers"),
    "54": (_U, "program limit exceeded: the daemon's statements are fixed and its "
               "bodies bounded, so this is a server limit (the NOTIFY queue full, "
               "max_stack_depth) that clears as the server catches up"),
    "55": (_C, "object not in prerequisite state: another session holds the object "
               "(lock not available, object in use); clears on retry"),
    "57": (_U, "operator intervention: statement or session timeout, cancel, "
               "shutdown, crash, a server not accepting connections yet"),
    "58": (_U, "system error: the server's own files or I/O failed"),
    "F0": (_U, "configuration file error: the server's own configuration"),
    "XX": (_U, "internal error: the server failed, not the request (damage below)"),
}

#: Single codes whose meaning differs from their class's.
SQLSTATE_CODES: dict[str, tuple[FailureCategory, str]] = {
    "25006": (_U, "read-only transaction: a hot standby refuses writes; clears with "
                  "a failover"),
    "25P03": (_U, "idle_in_transaction_session_timeout: a timeout ended the session"),
    "25P04": (_U, "transaction_timeout: a timeout ended the transaction"),
    "40003": (_U, "statement completion unknown: the connection was lost mid-commit"),
    "42501": (_D, "insufficient privilege: a grant is missing"),
    "55P02": (_I, "cannot change a runtime parameter: a setting the DSN asks for"),
    "55P04": (_I, "unsafe use of a new enum value: a statement this build sent"),
    "XX001": (_X, "data corrupted: the server reports damaged storage"),
    "XX002": (_X, "index corrupted: the server reports a damaged index"),
}


#: What the server says when it refuses a session at startup (SQLSTATE class
#: 28 and 42501, which libpq does not pass on at connect).
_CONNECT_REFUSALS = ("is not permitted to log in", "permission denied for database",
                     "password authentication failed", "no pg_hba.conf entry")


def classify(exc: BaseException) -> FailureCategory:
    """The failure category of a driver (or socket) error (see :data:`SQLSTATE_CLASSES`)."""
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(exc, psycopg.Error) and isinstance(sqlstate, str) and len(sqlstate) == 5:
        entry = SQLSTATE_CODES.get(sqlstate) or SQLSTATE_CLASSES.get(sqlstate[:2])
        return FailureCategory.INVALID if entry is None else entry[0]
    # No SQLSTATE: raised by libpq or psycopg, not the server. A refusal at
    # connect (FATAL messages at startup carry none) is told by its text; a
    # failed connect otherwise, "the connection is lost/closed", a socket
    # error: the control plane could not be asked.
    if isinstance(exc, psycopg.OperationalError) and any(
            text in str(exc) for text in _CONNECT_REFUSALS):
        return FailureCategory.DENIED
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | OSError
                  | TimeoutError):
        return FailureCategory.UNAVAILABLE
    return FailureCategory.INVALID


def map_error(exc: BaseException, *, what: str, url: str) -> ControlPlaneError:
    """Wrap a driver error for the caller; the message never holds the password."""
    detail = one_line(exc, scrub(str(exc), url))
    if isinstance(exc, _SCHEMA_MISSING):
        detail = f"{detail} ({MIGRATE_HINT})"
    return ControlPlaneError(f"control plane {what} failed: {detail}", category=classify(exc))


def connect(url: str, *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
            statement_timeout_s: float | None = 10.0, waits_idle: bool = False) -> Conn:
    """Open an autocommit connection (blocking; call it from a worker thread).

    ``waits_idle`` is for the LISTEN session, whose job is to idle. It turns the
    server's ``idle_session_timeout`` off for this session (PostgreSQL 14 and later),
    so a database that ends idle sessions does not end it between two notifications.
    Liveness is the listener's own probe.

    ``statement_timeout_s`` set here is *session* state: only for a connection known to
    be direct (the LISTEN child's). The store passes None and bounds each call per
    transaction (:func:`bounded`), which works behind PgBouncer's transaction pooling.
    Statements are never prepared server-side (``prepare_threshold=None``). A prepared
    statement is session state too: under transaction pooling, the next transaction
    may run on a server connection that never saw it.
    """
    # The DSN's parameters win; this daemon's defaults fill in whatever it leaves unset.
    params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    params = {"connect_timeout": str(max(2, round(connect_timeout_s))),
              "application_name": APPLICATION_NAME, **KEEPALIVE, **params}
    conninfo = make_conninfo("", **params)
    conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)
    try:
        set_session(conn, statement_timeout_s=statement_timeout_s, waits_idle=waits_idle)
    except BaseException:
        conn.close()
        raise
    return conn


def set_session(conn: Conn, *, statement_timeout_s: float | None, waits_idle: bool) -> None:
    """A direct session's own settings (:func:`connect`'s; blocking, its first statements).

    Apart from the connect, so a caller may run them as a call of their own. That
    call's deadline can shut the socket down (:func:`release_socket`). A server that
    completes the startup and then never answers holds them, not the connect.
    """
    if statement_timeout_s is not None:
        # set_config rather than "options=-c ..." at connect: a DSN's own
        # options parameter must keep working.
        conn.execute("SELECT set_config('statement_timeout', %s, false)",
                     [f"{timeout_ms(statement_timeout_s)}ms"])
    if waits_idle and conn.info.server_version >= IDLE_SESSION_TIMEOUT_SINCE:
        conn.execute("SELECT set_config('idle_session_timeout', '0', false)")


def call_bounds(read_timeout_s: float,
                connect_s: float | None = None) -> tuple[float, float]:
    """A call's connect timeout and statement timeout, from ``[control_plane].read_timeout_s``.

    The client-side deadline of one call (a connect, its setup and one statement) is
    ``read_timeout_s`` (17 s). The connect takes a third of it, at most
    ``CONNECT_TIMEOUT_S``. The statement takes the rest less 2 s of slack: the server's
    own statement_timeout normally fires first (its error says more). The store's calls
    and the LISTEN child's connect and setup share it.
    """
    if connect_s is None:
        connect_s = min(CONNECT_TIMEOUT_S, read_timeout_s / 3)
    return connect_s, max(read_timeout_s - connect_s - 2.0, read_timeout_s / 3)


def bytes_received(sock: socket.socket) -> int | None:
    """The bytes a TCP socket has received so far (Linux ``tcpi_bytes_received``)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except (OSError, AttributeError):
        return None  # not TCP (a Unix socket), or not Linux
    return int.from_bytes(info[128:136], "little") if len(info) >= 136 else None


def _socket_of(conn: Conn) -> socket.socket | None:
    """A duplicate of ``conn``'s socket (closing it leaves the connection's own open)."""
    try:
        return socket.socket(fileno=os.dup(conn.pgconn.socket))
    except (psycopg.Error, OSError):
        return None  # already closed


def release_socket(conn: Conn, first: Callable[[], object] = lambda: None) -> int | None:
    """Run ``first`` (a cancel request), then shut ``conn``'s socket down (blocking).

    A peer that accepts and never answers (its kernel still ACKs) trips neither
    keepalives nor ``tcp_user_timeout``; a cancel request may stall on it too. Only the
    shutdown makes a call blocked in libpq return: its worker thread ends, its
    descriptor is closed. The socket is duplicated first, so a descriptor number reused
    after the connection closes is never touched. Returns the bytes the socket had
    received.
    """
    sock = _socket_of(conn)
    if sock is None:
        return None  # already closed: nothing blocks on it
    received = bytes_received(sock)
    try:
        try:
            first()
        except (psycopg.Error, OSError) as exc:
            log.debug("cancel request failed", error=str(exc))
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.close()
    return received


def timeout_ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def dsn_sets_statement_timeout(url: str) -> bool:
    """True when the DSN's own ``options`` set ``statement_timeout`` (then it wins)."""
    try:
        options = conninfo_to_dict(url).get("options")
    except psycopg.ProgrammingError:
        return False
    return isinstance(options, str) and "statement_timeout" in options


def bounded(conn: Conn, fn: Callable[[Conn], T], statement_timeout_ms: int | None) -> T:
    """Run ``fn`` in one transaction whose statements are bounded by ``statement_timeout_ms``.

    ``SET LOCAL`` lasts until the transaction ends, so nothing outlives the
    call: no session state, which is what PgBouncer's transaction pooling
    requires. ``BEGIN`` and the setting travel in one round trip (simple
    query protocol, no parameters; the value is an int). ``fn`` may open
    ``conn.transaction()`` itself: that becomes a savepoint inside this one.
    None skips the setting (the DSN's own ``options`` set it) but keeps the
    transaction. On any failure the transaction is rolled back when the
    connection still can, so a connection is never returned mid-transaction.
    A connection found closed by that first round trip (the server's
    ``idle_session_timeout``, a pooler's idle limit) raises
    :class:`~supervisor.controlplane.runner.StaleConnection`: nothing of the
    call reached the server.
    """
    begin = ("BEGIN" if statement_timeout_ms is None
             else f"BEGIN; SET LOCAL statement_timeout = {int(statement_timeout_ms)}")
    try:
        conn.execute(begin)
    except psycopg.Error as exc:
        if conn.closed or conn.broken:
            raise StaleConnection(one_line(exc)) from exc
        raise
    try:
        result = fn(conn)
    except BaseException:
        if not conn.closed and not conn.broken:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error as exc:
                log.debug("rolling back a failed call failed", error=str(exc))
        raise
    conn.execute("COMMIT")
    return result


def _identity(conn: Conn) -> str | None:
    """``<system identifier>/<database oid>``: which cluster and database this is.

    A restore from a physical backup into a new cluster changes the first, a
    dropped and re-created database the second. ``pg_control_system()`` is
    executable by PUBLIC by default; where it was revoked only the oid is used.
    """
    try:
        # A savepoint when called inside bounded()'s transaction: the fallback
        # below must not run in an aborted transaction.
        with conn.transaction():
            row = conn.execute(
                "SELECT (SELECT system_identifier::text FROM pg_control_system()),"
                " (SELECT oid::text FROM pg_database WHERE datname = current_database())"
            ).fetchone()
    except pgerrors.InsufficientPrivilege:
        row = conn.execute(
            "SELECT NULL, (SELECT oid::text FROM pg_database WHERE datname = current_database())"
        ).fetchone()
    if row is None:
        return None
    return f"postgresql:{row[0] or '?'}/{row[1]}"


def _identity_checking_schema(conn: Conn) -> tuple[str | None, bool]:
    """:func:`_identity`, after refusing a schema a newer build migrated (SchemaTooNew),
    and whether the role may read the migrations table (every observe then looks too).

    A replica's role may be granted only what it reads (the pointer and the revisions).
    Where it may not read the migrations table, the look is skipped rather than
    refusing every read.
    """
    readable = True
    try:
        # A savepoint inside bounded()'s transaction: a refusal must not abort it.
        with conn.transaction():
            found = migrations.postgres_version(conn)
    except pgerrors.InsufficientPrivilege:
        found, readable = None, False
    migrations.check_not_newer(found, "postgresql")
    return _identity(conn), readable


# Schema changes can queue behind the advisory lock of another replica's run.
MIGRATE_TIMEOUT_S = 120.0


class PostgresStore(revisions.DatabaseStore):
    """RevisionAdmin on PostgreSQL, through worker threads (psycopg's async is asyncio-only).

    A cancelled call asks the server to stop its statement (``cancel_safe``) and the
    connection is replaced (:func:`~supervisor.controlplane.runner.call_interruptibly`).
    Every call is bounded, so nothing hangs the loop: ``connect_timeout``; a
    ``statement_timeout`` per transaction (:func:`bounded`); TCP keepalives and
    ``tcp_user_timeout`` against half-open connections; a client-side deadline over
    connect and statement (:func:`call_bounds`), for a network that swallows packets.
    Values in the DSN win over these defaults.

    Each call is one short explicit transaction; nothing stays open between calls (an
    idle-in-transaction session holds back vacuum and the NOTIFY queue). No session
    state at all (no session ``SET``, no server-side prepared statement): it works
    behind PgBouncer's transaction pooling. On a hot standby it reads; ``publish`` and
    ``migrate`` are refused there as ``unavailable``. Failures are mapped at this
    boundary (:func:`map_error`), the DSN's password scrubbed from every message.
    The store is its runner's :class:`~supervisor.controlplane.runner.Driver` for psycopg.
    """

    _sql = revisions.pg
    errors: tuple[type[BaseException], ...] = (psycopg.Error,)

    def __init__(self, config: ControlPlaneConfig, *, max_schema_version: int,
                 statement_timeout_s: float | None = None,
                 connect_timeout_s: float | None = None) -> None:
        super().__init__(config, max_schema_version)
        self._url = config.url
        self._channel = config.channel
        # The client-side deadline ([control_plane].read_timeout_s, 17 s): a
        # connect (5 s) plus one statement (10 s), plus slack (call_bounds).
        read_s = config.read_timeout_s
        self._connect_s, statement_s = call_bounds(read_s, connect_timeout_s)
        statement_s = statement_s if statement_timeout_s is None else statement_timeout_s
        # Per call, never per session (see bounded()); the DSN's options win.
        self._timeout_ms = None if (
            dsn_sets_statement_timeout(config.url)) else timeout_ms(statement_s)
        # Read at every connect: a restore or another database behind the
        # same DSN can only appear across a new connection.
        self._schema_readable = False
        # Bytes received: at the last call's start, and by the last call given up on.
        self._before: int | None = None
        self._received: int | None = None
        self._runner = ConnectionRunner(self, deadline_s=(
            read_s if statement_timeout_s is None else self._connect_s + statement_s + 2.0))

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self._url)!r})"

    async def migrate(self) -> migrations.Migrated:
        done = await self._runner.run("migrate", partial(
            migrations.migrate_postgres, channel=self._channel), deadline_s=MIGRATE_TIMEOUT_S)
        log.info("control-plane schema migrated" if done.before < done.after
                 else "control-plane schema up to date",
                 before=done.before, version=done.after, url=redact(self._url))
        return done

    # -- the runner's driver (blocking, in worker threads) ----------------------------

    def open(self, stop: threading.Event) -> Conn:
        # Nothing to interrupt while connecting (``stop`` unused; libpq's
        # connect_timeout bounds it): a cancelled connect is abandoned, and its
        # connection closed if it ever completes.
        conn = connect(self._url, connect_timeout_s=self._connect_s, statement_timeout_s=None)
        log.debug("control-plane connection opened", url=redact(self._url))
        return conn

    def setup(self, conn: Conn) -> None:
        """The cluster and database (``postgresql:<system id>/<oid>``) become ``identity``."""
        self.identity, self._schema_readable = _identity_checking_schema(conn)

    def call(self, conn: Conn, fn: Callable[[Conn], T], stop: threading.Event) -> T:
        sock = _socket_of(conn)
        if sock is not None:
            with sock:
                self._before = bytes_received(sock)
        return bounded(conn, fn, self._timeout_ms)

    def interrupt(self, conn: Conn, stop: threading.Event) -> None:
        after = release_socket(conn, partial(conn.cancel_safe, timeout=INTERRUPT_GRACE_S))
        before, self._received = self._before, None
        if after is not None and before is not None:
            self._received = after - before

    def received(self) -> int | None:
        return self._received

    def close(self, conn: Conn) -> None:
        dispose_quietly(conn.close)

    def map_error(self, exc: BaseException, what: str) -> ControlPlaneError:
        return map_error(exc, what=what, url=self._url)

    def keeps(self, conn: Conn, error: ControlPlaneError) -> bool:
        # After a refusal the operator may fix a session setting (search_path,
        # a grant): only a new connection is sure to see the fix.
        return (error.category not in (FailureCategory.INVALID, FailureCategory.DENIED)
                and not conn.closed and not conn.broken
                and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
