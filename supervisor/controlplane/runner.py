"""Blocking driver calls from trio: abandonable worker threads, and the one-connection runner.

:func:`call_interruptibly` runs one call; :class:`ConnectionRunner` is the connection
lifecycle both stores share. The LISTEN child holds its session itself, with
:func:`open_interruptibly` and :func:`call_interruptibly`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Generic, Protocol, TypeVar

import trio

from supervisor.controlplane.errors import ControlPlaneError, FailureCategory, malformed, slow_read
from supervisor.logs import get_logger
from supervisor.threads import in_thread

__all__ = ["INTERRUPT_GRACE_S", "ConnectionRunner", "Driver", "StaleConnection",
           "call_interruptibly", "dispose_quietly", "in_db_thread", "open_interruptibly",
           "read_deadline_s"]

log = get_logger("controlplane")

T = TypeVar("T")
C = TypeVar("C")

#: How long a cancelled call may spend interrupting its statement. Cleanup runs
#: shielded, and a shield without a deadline can hang a shutdown.
INTERRUPT_GRACE_S = 2.0

# Our own decoding of a row the schema should not allow raises one of these;
# the connection itself is fine (see errors.malformed).
DECODING_ERRORS = (TypeError, ValueError, LookupError, AttributeError, ArithmeticError)


class StaleConnection(Exception):
    """A kept connection was found closed before the call sent anything (``__cause__``: why).

    A server's ``idle_session_timeout`` or a pooler's idle limit closes a
    connection while it waits between calls. Nothing of the call reached the
    server, so it is safe to run again on a new connection, writes included.
    A driver raises this only for a failure of its very first round trip.
    """


class _Call(Generic[T]):
    """One blocking call in a worker thread, which the trio side may give up on.

    Given up on while it runs, the call's resource cannot be closed from trio: the
    driver is mid-call on it. So the disposal is handed to the worker thread, which
    runs it when the call returns. The lock makes "still running?" and "hand over"
    atomic.
    """

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._done = False
        self._dispose: Callable[[], object] | None = None

    def run(self) -> T:
        try:
            return self._fn()
        finally:
            with self._lock:
                self._done = True
                dispose = self._dispose
            if dispose is not None:
                dispose_quietly(dispose)

    def give_up(self, dispose: Callable[[], object]) -> None:
        """Dispose now (in a background thread) if finished, else when the call returns."""
        with self._lock:
            if not self._done:
                self._dispose = dispose
                return
        # Closing a connection can block on the network: never in the trio thread.
        trio.lowlevel.start_thread_soon(lambda: dispose_quietly(dispose), lambda _: None)


def in_db_thread(fn: Callable[[], T], what: str, deadline_s: float = math.inf) -> Awaitable[T]:
    """``fn()`` in a worker thread of the database's own limit (see ``threads.in_thread``)."""
    return in_thread(fn, dependency="database", deadline_s=deadline_s, what=what)


def dispose_quietly(dispose: Callable[[], object]) -> None:
    """Run ``dispose`` (a connection's close); a failure is only logged, never raised."""
    # Runs where nobody could handle an error: the connection is being thrown
    # away, so a failure to close it cleanly only matters as a log line.
    try:
        dispose()
    except Exception as exc:  # noqa: BLE001
        log.debug("closing a control-plane connection failed", error=str(exc))


async def call_interruptibly(fn: Callable[[], T], *, interrupt: Callable[[], object],
                             dispose: Callable[[], object],
                             grace_s: float = INTERRUPT_GRACE_S) -> T:
    """Run blocking ``fn`` in a worker thread; return its result or raise its error.

    On cancellation trio abandons the thread at once. Then ``interrupt()`` runs in
    another thread, shielded, for at most ``grace_s``: it asks the server to stop the
    statement (``cancel_safe`` / ``sqlite3.interrupt``), so a hung query does not keep
    its locks. The connection is thrown away: ``dispose()`` runs in a worker thread
    once ``fn`` has returned. The caller must forget the connection when this raises
    Cancelled, and make a new one. A cancelled write has an unknown outcome (the
    commit may have won the race), like any unanswered write.
    """
    call = _Call(fn)
    try:
        # The caller's deadline bounds it (every caller has one).
        return await in_db_thread(call.run, "a database call")
    except trio.Cancelled:
        with trio.CancelScope(shield=True):
            try:
                await in_db_thread(interrupt, "interrupting a database call", grace_s)
            except Exception as exc:  # noqa: BLE001 - best effort; the connection is discarded anyway
                log.debug("interrupting a cancelled statement failed", error=str(exc))
        call.give_up(dispose)
        raise


class Driver(Protocol[C]):
    """How a store's connections are opened, used, interrupted and closed.

    Every method but :meth:`map_error` and :meth:`keeps` blocks and runs in a
    worker thread. ``stop`` is set when the trio side gives up on the call.
    """

    #: The driver's own exception types (OSError is always added).
    errors: tuple[type[BaseException], ...]

    def open(self, stop: threading.Event) -> C:
        """A new connection; closes it itself when opening fails."""

    def setup(self, conn: C) -> None:
        """A new connection's first call (run through :meth:`call`, so interruptible)."""

    def call(self, conn: C, fn: Callable[[C], T], stop: threading.Event) -> T:
        """Run ``fn`` on ``conn`` within the driver's own bounds (a transaction, retries)."""

    def interrupt(self, conn: C, stop: threading.Event) -> None:
        """Ask the server to stop what ``conn`` is running (best effort)."""

    def close(self, conn: C) -> None:
        """Close ``conn``; never raises (the connection is being thrown away)."""

    def map_error(self, exc: BaseException, what: str) -> ControlPlaneError:
        """The driver's error as ours (the message scrubbed of secrets)."""

    def keeps(self, conn: C, error: ControlPlaneError) -> bool:
        """True when ``conn`` is still usable after ``error`` (otherwise it is replaced)."""

    def received(self) -> int | None:
        """Bytes the last call given up on had received (None: not known)."""


class ConnectionRunner(Generic[C]):
    """One lazily opened connection, one call at a time, each under a deadline.

    The connection is dropped on cancellation and on a driver error that leaves it
    unusable; the next call opens another. The close is bounded and shielded. A store
    gives it a :class:`Driver`.

    ``before(what)`` (optional) runs inside the lock ahead of every call, before the
    connection is opened. The SQLite store checks there that its path still names the
    file its connection reads (else it calls :meth:`discard`).
    """

    def __init__(self, driver: Driver[C], *, deadline_s: float,
                 before: Callable[[str], Awaitable[None]] | None = None) -> None:
        self._driver = driver
        self._deadline_s = deadline_s
        self._before = before
        self._limiter = trio.CapacityLimiter(1)
        self._conn: C | None = None
        self._closed = False
        self._errors: tuple[type[BaseException], ...] = (*driver.errors, OSError)

    @property
    def connection(self) -> C | None:
        """The open connection, if any (for ``before``)."""
        return self._conn

    async def discard(self) -> None:
        """Close the open connection, if any; the next call opens a new one. Cancelled,
        it returns at once and the close finishes in its worker thread."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with trio.move_on_after(INTERRUPT_GRACE_S):
                await in_db_thread(partial(self._driver.close, conn), "closing a connection")

    @property
    def deadline_s(self) -> float:
        """One call's deadline (a body's read gets more: :func:`read_deadline_s`)."""
        return self._deadline_s

    async def run(self, what: str, fn: Callable[[C], T], *,
                  deadline_s: float | None = None, body: tuple[int, int] | None = None) -> T:
        """``fn(conn)`` in a worker thread; raises :class:`ControlPlaneError` naming ``what``.

        ``body`` (revision, size) names what the call reads: its timeout is
        then :func:`~supervisor.controlplane.errors.slow_read`, not an outage.
        """
        if self._closed:
            raise ControlPlaneError("the store is closed", category=FailureCategory.INVALID)
        deadline_s = self._deadline_s if deadline_s is None else deadline_s
        # The deadline covers the wait for the connection too: a call still
        # holding it must not hold every later one without a bound.
        started = trio.current_time()
        with trio.move_on_after(deadline_s):
            async with self._limiter:
                return await self._run_locked(what, fn)
        if body is not None:
            raise slow_read(what, *body, trio.current_time() - started, self._driver.received())
        raise ControlPlaneError(f"control plane {what} timed out after {deadline_s:g} s",
                                category=FailureCategory.UNAVAILABLE)

    async def aclose(self) -> None:
        """Close the connection; later calls are refused. Shielded and bounded."""
        self._closed = True
        # Often called from a cancelled scope during shutdown.
        with trio.move_on_after(INTERRUPT_GRACE_S, shield=True):
            async with self._limiter:
                await self.discard()

    async def _run_locked(self, what: str, fn: Callable[[C], T]) -> T:
        driver = self._driver
        if self._before is not None:
            await self._before(what)
        conn = self._conn
        stop = threading.Event()
        try:
            if conn is not None:
                try:
                    return await self._call(conn, fn, stop)
                except StaleConnection as exc:
                    # Closed by the server while idle: replaced within this
                    # call (and its deadline), no outage to report.
                    # Through map_error: its message is scrubbed of the DSN's password.
                    log.debug("control-plane connection closed while idle; reconnecting",
                              error=str(driver.map_error(exc.__cause__ or exc, what)))
                    await self.discard()
            conn = await self._open(stop)
            return await self._call(conn, fn, stop)
        except StaleConnection as exc:
            # Even a new connection failed at once: report why.
            cause = exc.__cause__ or exc
            error = driver.map_error(cause, what)
            await self.discard()
            raise error from cause
        except trio.Cancelled:
            # call_interruptibly has handed the connection over for closing.
            self._conn = None
            raise
        except self._errors as exc:
            error = driver.map_error(exc, what)
            if conn is not None and not driver.keeps(conn, error):
                await self.discard()
            raise error from exc
        except DECODING_ERRORS as exc:
            # Traceback dropped: it holds the rows (see errors.malformed).
            raise malformed(exc, what=what) from exc.with_traceback(None)
        finally:
            if self._closed and self._conn is not None:
                # aclose() ran while this call held the connection.
                stale, self._conn = self._conn, None
                trio.lowlevel.start_thread_soon(partial(driver.close, stale), lambda _: None)

    async def _call(self, conn: C, fn: Callable[[C], T], stop: threading.Event) -> T:
        driver = self._driver
        return await call_interruptibly(partial(driver.call, conn, fn, stop),
                                        interrupt=partial(driver.interrupt, conn, stop),
                                        dispose=partial(driver.close, conn))

    async def _open(self, stop: threading.Event) -> C:
        driver = self._driver
        conn = self._conn = await open_interruptibly(
            partial(driver.open, stop), driver.close, interrupt=stop.set)
        try:
            # A call like any other: past the deadline its socket is released.
            await self._call(conn, driver.setup, stop)
        except trio.Cancelled:
            raise  # call_interruptibly has handed the connection over for closing
        except BaseException:
            await self.discard()  # whatever failed (a schema too new), never kept
            raise
        return conn


def read_deadline_s(base_s: float, size: int, min_rate_kib_s: float) -> float:
    """A body read's deadline: ``base_s`` plus 1 s per ``min_rate_kib_s`` KiB of ``size``."""
    return base_s + size / 1024 / min_rate_kib_s


async def open_interruptibly(open_one: Callable[[], C], close: Callable[[C], object], *,
                             interrupt: Callable[[], object] = lambda: None) -> C:
    """A new connection from blocking ``open_one``, through :func:`call_interruptibly`.

    A cancelled open is abandoned, and its connection closed (``close``) if it
    ever completes.
    """
    made: list[C] = []

    def opened() -> C:
        made.append(open_one())
        return made[-1]

    def dispose() -> None:
        for conn in made:
            close(conn)

    return await call_interruptibly(opened, interrupt=interrupt, dispose=dispose)
