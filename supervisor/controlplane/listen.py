"""The LISTEN child: :func:`run_listener` turns PostgreSQL notifications into wake-ups.

Operators: docs/operations.md, "Fleets" and "When a dependency is stuck".
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

import psycopg
import trio
from psycopg import sql

from supervisor.backoff import Backoff
from supervisor.controlplane.errors import one_line
from supervisor.controlplane.postgres import Conn, call_bounds, connect, release_socket, set_session
from supervisor.controlplane.runner import (
    INTERRUPT_GRACE_S,
    call_interruptibly,
    in_db_thread,
    open_interruptibly,
)
from supervisor.dsn import redact, scrub
from supervisor.logs import get_logger
from supervisor.streak import Streak
from supervisor.wakeup import Wakeup

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig
    from supervisor.telemetry import Metrics

__all__ = ["WakeFloor", "run_listener"]

log = get_logger("listen")

#: Deadline of one probe; a healthy server answers SELECT 1 in milliseconds.
PROBE_TIMEOUT_S = 5.0
#: How often a listener parked on a hot standby checks whether it was promoted.
STANDBY_RECHECK_S = 300.0

#: Wake-ups in a row that yield nothing before the connection is probed early
#: (a readable socket that never yields anything would otherwise spin).
EMPTY_WAKES_BEFORE_PROBE = 3


async def run_listener(config: ControlPlaneConfig, wake: Callable[[str], None], metrics: Metrics, *,
                       probe_interval_s: float = 30.0, poke: Wakeup | None = None,
                       reconnecting: Callable[[bool], None] = lambda _on: None,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen for desired-state notifications until cancelled; never raises otherwise.

    A notification on ``[control_plane].channel`` (the trigger on ``supervisor_desired``
    sends it at commit) calls ``wake("notify")``: the loop looks at once, not at its
    next poll. It is only a hint. NOTIFY reaches only sessions listening at commit and
    is never replayed, so polling stays the correctness path. Hence:

    * it reports started at once, before connecting: a control plane that is down
      must not hold up readiness;
    * it calls ``wake("reconnect")`` after every (re)connect: what was notified
      meanwhile is gone;
    * a failure is logged as a streak (:class:`~supervisor.streak.Streak`), then it
      reconnects with backoff. Cancelled propagates; shutdown is prompt in any state.

    ``reconnecting(True)`` is called when a connect fails or the connection is lost.
    ``reconnecting(False)`` comes once it listens again (or parks on a standby), as
    from the upstream hint: the receiver keeps only a change (``Tree.report_substate``);
    ``/status`` shows the child ``reconnecting`` meanwhile. ``poke``
    is the loop's :class:`~supervisor.wakeup.Wakeup`, which the daemon owns, so it
    outlives either child (:meth:`_Listener.run`). SQLite, or ``listen = false``: it
    reports started and idles until cancelled. Metrics: ``listen_connected``,
    ``listen_notifications``, ``listen_reconnects``, ``listen_wakeups_held``.
    """
    task_status.started()
    if config.backend != "postgresql" or not config.listen:
        log.info("notifications disabled; converging by polling alone",
                 backend=config.backend, listen=config.listen)
        await trio.sleep_forever()
    await _Listener(config, wake, metrics, probe_interval_s, poke or Wakeup(),
                    reconnecting=reconnecting).run()


class WakeFloor:
    """Wake-ups, at most one per ``min_interval_s``; the upstream hint uses it too.

    Anyone who may connect may ``NOTIFY`` the channel, with no table privilege. So
    what comes sooner than the interval is held. One wake-up then covers it all: the
    loop reads the control plane, not the payload. :meth:`notified` wakes at once when
    the interval has passed, else holds. :meth:`release` waits out the interval of a
    held one, then sends it. Time is trio's clock.
    """

    def __init__(self, wake: Callable[[], None], min_interval_s: float) -> None:
        self._wake = wake
        self.min_interval_s = min_interval_s
        self._next_at = -math.inf
        self.held = False

    @property
    def due(self) -> float:
        """When the held wake-up may go out (infinity: none is held)."""
        return self._next_at if self.held else math.inf

    def notified(self) -> bool:
        """Wake now (True), or hold the wake-up until the floor (False)."""
        now = trio.current_time()
        if now >= self._next_at:
            self._send(now)
            return True
        self.held = True
        return False

    async def release(self) -> None:
        """Send the held wake-up, if any, once the interval since the last one has passed."""
        if self.held:
            await trio.sleep_until(self._next_at)
            self.held = False
            self._send(trio.current_time())

    def _send(self, now: float) -> None:
        self._next_at = now + self.min_interval_s
        self._wake()


class _ConnectionLost(Exception):
    """The LISTEN connection stopped answering (probe deadline)."""


class _SessionTimedOut(Exception):
    """No listening session within the deadline (a connect or a statement unanswered)."""


class _InRecovery(Exception):
    """The server is a hot standby: LISTEN cannot run there, NOTIFY is not replicated."""


class _Listener:
    """One LISTEN connection at a time, reconnected until cancelled.

    A dedicated autocommit connection runs ``LISTEN``. The wait is native:
    ``trio.lowlevel.wait_readable`` on its socket, no thread parked. It drains
    ``conn.notifies(timeout=0)`` before every wait: any statement moves pending
    notifications into psycopg's backlog, which only ``notifies()`` reads. A wait is
    bounded by ``probe_interval_s``; then a ``SELECT 1`` under a deadline proves the
    connection is not half-open. ``notify_closing`` precedes every close. Connects
    and probes run in abandonable threads
    (:func:`~supervisor.controlplane.runner.call_interruptibly`).

    A held wake-up counts in ``listen_wakeups_held``; a storm is a streak (``notification
    storm began`` ... ``ended``, once a notification comes a full interval after the last
    wake-up). The backoff resets once a connection proved healthy (a probe answered, a
    notification came). So a server that accepts and drops at once is retried ever
    more slowly.

    On a hot standby (``pg_is_in_recovery()``) LISTEN cannot run, and NOTIFY is not
    replicated. It says so once, at info, and closes. It looks again every
    :data:`STANDBY_RECHECK_S`, in case of a promotion. ``[control_plane].listen_url``,
    when set, is a direct connection beside a ``url`` through transaction pooling.
    """

    def __init__(self, config: ControlPlaneConfig, wake: Callable[[str], None], metrics: Metrics,
                 probe_interval_s: float, poke: Wakeup, *,
                 reconnecting: Callable[[bool], None] = lambda _on: None) -> None:
        self.url = config.listen_dsn
        # One store call's bounds: the connect's, the session's statements', and
        # the deadline of the whole connect and setup.
        self.connect_s, self.statement_s = call_bounds(config.read_timeout_s)
        self.session_deadline_s = config.read_timeout_s
        self._reconnecting = reconnecting
        self.poke = poke
        self.pokes_seen = poke.count  # the pokes a wait of ours has already answered
        self.standby_reported = False
        self.outage = Streak(log, began="LISTEN connection unreachable",
                             ongoing="LISTEN connection still unreachable",
                             ended="LISTEN connection reachable again")
        self.channel = config.channel
        # The convergence loop's wake-up (ChangeSignal.notify): this module
        # knows nothing of the loop above it.
        self.wake = wake
        self.floor = WakeFloor(partial(wake, "notify"), config.notify_min_interval_s)
        self.storm = Streak(log, began="notification storm began",
                            ongoing="notification storm goes on",
                            ended="notification storm ended")
        self.metrics = metrics
        self.probe_interval_s = probe_interval_s
        self.backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
        # False once an abandoned probe thread has taken the connection over.
        self._owns_conn = False

    async def run(self) -> None:
        """Connect, serve, reconnect; the loop's pokes cut the waits short.

        The loop pokes when the control plane stops or starts answering. A poke while
        not waiting (connecting, probing) counts at the next wait. Waiting to reconnect,
        it reconnects at once, its backoff reset. Connected, it probes at once: a frozen
        primary shows within the probe deadline.
        """
        while True:
            try:
                conn = await self._connect()
            except _InRecovery:
                self._reconnecting(False)
                await self._park_on_standby()
                continue
            except Exception as exc:  # noqa: BLE001 - logged; polling covers the gap
                self._reconnecting(True)
                self.metrics.listen_reconnects.inc()
                delay = self.backoff.next()
                self.outage.failed(error=self._describe(exc), retry_in_s=round(delay, 3),
                                   url=redact(self.url))
                await self._sleep_unless_poked(delay)
                continue

            self.metrics.listen_connected.set(1)
            self._reconnecting(False)
            self._owns_conn = True
            self.outage.recovered()
            log.info("listening for desired-state notifications", channel=self.channel)
            # Whatever was published while we were not listening was never
            # delivered to us: one wake-up makes the loop look now.
            self.wake("reconnect")
            try:
                await self._serve(conn)
            except Exception as exc:  # noqa: BLE001 - logged; polling covers the gap
                self._reconnecting(True)
                self.outage.failed(error=self._describe(exc), url=redact(self.url))
            finally:
                self.metrics.listen_connected.set(0)
                if self._owns_conn:
                    await _close(conn)
            await self._sleep_unless_poked(self.backoff.next())

    async def _park_on_standby(self) -> None:
        """Idle while the server is a hot standby: an outage it is not, so no error lines."""
        self.outage.recovered()
        self.backoff.reset()
        if not self.standby_reported:
            self.standby_reported = True
            log.info("the control plane is a hot standby: LISTEN cannot run during recovery and "
                     "NOTIFY is not replicated; converging by polling alone",
                     url=redact(self.url), recheck_s=STANDBY_RECHECK_S)
        await trio.sleep(STANDBY_RECHECK_S)

    async def _sleep_unless_poked(self, delay: float) -> None:
        """The reconnect backoff, cut short (and reset) when the loop says the server is back."""
        if await self._poked_within(delay):
            self.backoff.reset()

    async def _poked_within(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a poke not answered yet; True when one came."""
        if await self.poke.wait(timeout_s, since=self.pokes_seen):
            self.pokes_seen = self.poke.count
            return True
        return False

    def _describe(self, exc: BaseException) -> str:
        return one_line(exc, scrub(str(exc), self.url))

    async def _connect(self) -> Conn:
        """A listening session, connected and set up within ``session_deadline_s``.

        That is ``read_timeout_s``, one store call's deadline
        (:func:`~supervisor.controlplane.postgres.call_bounds`): a server that never
        answers its startup or a statement is given up on, and retried.

        The connect and the setup are two calls, as the store's open and setup are
        (:class:`~supervisor.controlplane.runner.ConnectionRunner`). A connect given up
        on is abandoned: libpq's ``connect_timeout`` ends its thread, and the
        connection is closed if it ever completes. A setup given up on has its socket
        shut down, so its thread returns at once.
        """
        deadline_s = self.session_deadline_s
        with trio.move_on_after(deadline_s):
            conn = await open_interruptibly(
                partial(connect, self.url, connect_timeout_s=self.connect_s,
                        statement_timeout_s=None),
                lambda conn: conn.close())
            try:
                await call_interruptibly(
                    partial(self._set_up, conn),
                    interrupt=partial(release_socket, conn,
                                      partial(conn.cancel_safe, timeout=INTERRUPT_GRACE_S)),
                    dispose=conn.close)
            except trio.Cancelled:
                raise  # call_interruptibly has handed the connection over for closing
            except BaseException:
                await _close(conn)
                raise
            return conn
        raise _SessionTimedOut(f"connect and LISTEN did not finish within {deadline_s:g} s "
                               "([control_plane].read_timeout_s)")

    def _set_up(self, conn: Conn) -> None:
        """The session's settings, the standby question and ``LISTEN`` (blocking)."""
        set_session(conn, statement_timeout_s=self.statement_s, waits_idle=True)
        if conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,):
            raise _InRecovery
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))

    async def _serve(self, conn: Conn) -> None:
        fd = conn.fileno()
        empty_wakes = 0
        while True:
            if self._drain(conn):
                empty_wakes = 0
                self.backoff.reset()
            woken = await self._wait(fd)
            if woken == "released":  # a held wake-up went out: read on
                continue
            if woken != "readable":  # the probe deadline, or poked by the loop
                await self._probe(conn)
                continue
            # Readable: the next _drain reads it. A socket that keeps waking us
            # with nothing in it gets probed rather than spun on.
            empty_wakes += 1
            if empty_wakes > EMPTY_WAKES_BEFORE_PROBE:
                empty_wakes = 0
                await self._probe(conn)

    async def _wait(self, fd: int) -> str:
        """Wait until ``fd`` is readable, a poke, the probe interval, or the floor lets
        a held wake-up go ("released"): which one came.

        The socket is read meanwhile, whatever is held. A session that fell behind
        would keep the server's notification queue from being truncated. And a full
        queue fails every NOTIFY of the cluster.
        """
        woken = "timeout"

        async def released() -> str | None:  # None: nothing held, so nothing to wait for
            if not self.floor.held:
                return None
            await self.floor.release()
            return "released"

        async def readable() -> str:
            await trio.lowlevel.wait_readable(fd)
            return "readable"

        async def poked() -> str:
            return "poke" if await self._poked_within(self.probe_interval_s) else "timeout"

        async with trio.open_nursery() as nursery:

            async def first(wait: Callable[[], Awaitable[str | None]]) -> None:
                nonlocal woken
                if (came := await wait()) is not None:
                    woken = came
                    nursery.cancel_scope.cancel()

            for wait in (readable, poked, released):
                nursery.start_soon(first, wait)
        return woken

    def _drain(self, conn: Conn) -> int:
        # Non-blocking: reads what the socket already holds, raises
        # OperationalError when the server has gone.
        count = 0
        for note in conn.notifies(timeout=0):
            count += 1
            log.debug("notification", channel=note.channel, payload=note.payload[:32])
        if count:
            self.metrics.listen_notifications.inc(count)
            was_held = self.floor.held
            if self.floor.notified():
                self.storm.recovered()
            elif not was_held:
                self.metrics.listen_wakeups_held.inc()
                self.storm.failed()
        return count

    async def _probe(self, conn: Conn) -> None:
        with trio.move_on_after(PROBE_TIMEOUT_S) as deadline:
            try:
                await call_interruptibly(partial(conn.execute, "SELECT 1"), dispose=conn.close,
                                         interrupt=partial(conn.cancel_safe,
                                                           timeout=INTERRUPT_GRACE_S))
            except trio.Cancelled:
                # Shutdown or the probe deadline: the abandoned worker thread
                # now owns the connection and closes it when the driver returns.
                self._owns_conn = False
                raise
        if deadline.cancelled_caught:
            raise _ConnectionLost(f"no answer to a probe within {PROBE_TIMEOUT_S:g} s")
        self.backoff.reset()


async def _close(conn: Conn) -> None:
    if not conn.closed:
        # Wake (with ClosedResourceError) any task still waiting on this socket
        # before the descriptor is closed and its number reused.
        with contextlib.suppress(psycopg.Error):
            trio.lowlevel.notify_closing(conn.fileno())
    with trio.move_on_after(INTERRUPT_GRACE_S, shield=True):
        try:
            await in_db_thread(conn.close, "closing the LISTEN connection")
        except Exception as exc:  # noqa: BLE001 - the connection is gone either way
            log.debug("closing the LISTEN connection failed", error=str(exc))
