"""The LISTEN child: turns PostgreSQL notifications into ChangeSignal wake-ups.

Contract: a notification on ``[control_plane].channel`` (sent by the trigger
on ``supervisor_desired`` at commit, payload the revision id) wakes the
convergence loop at once instead of at its next poll. It is only a hint:
NOTIFY is delivered only to sessions listening at commit time and is never
replayed, so polling stays the correctness path, and this child
  * reports started at once, before connecting: a control plane that is down
    must not hold up readiness; from a failed connect or a lost connection
    until it listens again it says so (``reconnecting``: ``/status`` shows the
    child ``reconnecting`` rather than ``running``);
  * connects and sets its session up (its settings, the standby question,
    ``LISTEN``) within ``[control_plane].read_timeout_s``, the deadline of one
    store call (:func:`~supervisor.controlplane.postgres.call_bounds`): a
    server that accepts and never answers its startup or a statement is given
    up on, the socket shut down, and retried like any failed connect;
  * calls ``wake("reconnect")`` after every (re)connect, since
    whatever was notified while disconnected is gone;
  * never lets a failure escape (each is logged, then it reconnects with
    bounded exponential backoff and jitter); Cancelled always propagates, and
    shutdown is prompt whether it is waiting, probing or reconnecting.

Mechanics (measured under trio and psycopg 3): a dedicated autocommit connection runs
``LISTEN``; the wait is native, ``trio.lowlevel.wait_readable`` on the
connection's socket (no thread parked), draining ``conn.notifies(timeout=0)``
before every wait, which is also after the previous one (any statement moves
pending notifications into psycopg's own backlog, which only ``notifies()``
reads). The wait is bounded by ``probe_interval_s``; when it runs out, a
``SELECT 1`` (in a worker thread, under a deadline) proves the connection is
not half-open, which a socket that never becomes readable cannot show.
``trio.lowlevel.notify_closing`` precedes every close. Connects and probes run
in abandonable worker threads (:func:`~supervisor.controlplane.store.call_interruptibly`).

The backoff resets once a connection has proven healthy (a probe succeeded or
a notification arrived), so a server that accepts and immediately drops
connections is retried ever more slowly rather than in a tight loop.

Recovery is prompt: the convergence loop pokes this child (a
:class:`~supervisor.wakeup.Wakeup` the daemon owns, so it survives restarts of
either child) when the control plane stops or starts answering; a poke that
comes while the child is not waiting (connecting, probing) counts at its next
wait. Poked while waiting to reconnect, it reconnects at once with its backoff
reset (a two-minute outage no longer leaves LISTEN down for a further 30 s);
poked while connected, it probes the connection at once (a frozen primary is
noticed within the probe deadline, not at the next probe).
Failures are logged as a streak (:class:`~supervisor.streak.Streak`): the
first at once, then at most one line a minute, and one line when it ends.

Storms: anyone who may connect may ``NOTIFY`` the channel, no table privilege
needed. Notifications wake the loop at most once per
``[control_plane].notify_min_interval_s`` (:class:`WakeFloor`): whatever
arrives sooner is held, and the wake-up goes out when the interval has passed,
covering everything that came meanwhile (the loop reads the control plane,
not the payload). Each held wake-up counts in ``listen_wakeups_held``; a storm
is logged as a streak (:class:`~supervisor.streak.Streak`): ``notification
storm began`` at once, then at most one line a minute, and ``notification
storm ended`` once a notification comes a full interval after the last wake-up.

Metrics: ``listen_connected`` (1 while listening), ``listen_notifications``
(notifications received), ``listen_reconnects`` (failed connect attempts),
``listen_wakeups_held`` (wake-ups held back by the floor).
SQLite, or ``listen = false``, has nothing to listen to: the child then
reports started and idles until cancelled, so a supervisor never sees it exit.

Fleets: the child connects to ``[control_plane].listen_url`` when set (a direct
connection beside a ``url`` that goes through a transaction-pooling PgBouncer,
which cannot carry LISTEN), else to ``url``. A hot standby refuses ``LISTEN``
during recovery and NOTIFY is not replicated, so the child asks
``pg_is_in_recovery()`` before listening: on a standby it says so once, at
info level, closes the connection and idles (the loop converges by polling),
looking again only every ``STANDBY_RECHECK_S`` (quietly) in case the standby
is promoted, when it starts listening like on any primary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import psycopg
import trio
from psycopg import sql

from supervisor.backoff import Backoff
from supervisor.controlplane.errors import one_line
from supervisor.controlplane.postgres import (
    Conn,
    call_bounds,
    connect,
    release_socket,
    set_session,
)
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


async def run_listener(
    config: ControlPlaneConfig,
    wake: Callable[[str], None],
    metrics: Metrics,
    *,
    probe_interval_s: float = 30.0,
    poke: Wakeup | None = None,
    reconnecting: Callable[[bool], None] = lambda _on: None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen for desired-state notifications until cancelled; never raises otherwise.

    ``reconnecting(True)`` is called when a connect fails or the connection is
    lost, ``reconnecting(False)`` once it listens again (or parks on a standby):
    only on a change.
    """
    task_status.started()
    if config.backend != "postgresql" or not config.listen:
        log.info(
            "notifications disabled; converging by polling alone",
            backend=config.backend,
            listen=config.listen,
        )
        await trio.sleep_forever()
    await _Listener(config, wake, metrics, probe_interval_s, poke or Wakeup(),
                    reconnecting=reconnecting).run()


class WakeFloor:
    """Wake-ups, at most one per ``min_interval_s`` (module docstring); also the upstream hint's.

    :meth:`notified` wakes at once when the interval since the last wake-up
    has passed, and holds the wake-up otherwise; :meth:`release` waits out the
    interval of a held one and then sends it. Time is trio's clock.
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
    def __init__(
        self,
        config: ControlPlaneConfig,
        wake: Callable[[str], None],
        metrics: Metrics,
        probe_interval_s: float,
        poke: Wakeup,
        *,
        reconnecting: Callable[[bool], None] = lambda _on: None,
    ) -> None:
        self.url = config.listen_dsn
        # One store call's bounds: the connect's, the session's statements', and
        # the deadline of the whole connect and setup.
        self.connect_s, self.statement_s = call_bounds(config.read_timeout_s)
        self.session_deadline_s = config.read_timeout_s
        self._reconnecting = reconnecting
        self._reported_reconnecting = False
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
        while True:
            try:
                conn = await self._connect()
            except _InRecovery:
                self._report_reconnecting(False)
                await self._park_on_standby()
                continue
            except Exception as exc:  # noqa: BLE001 - logged; polling covers the gap
                self._report_reconnecting(True)
                self.metrics.listen_reconnects.inc()
                delay = self.backoff.next()
                self.outage.failed(
                    error=self._describe(exc),
                    retry_in_s=round(delay, 3),
                    url=redact(self.url),
                )
                await self._sleep_unless_poked(delay)
                continue

            self.metrics.listen_connected.set(1)
            self._report_reconnecting(False)
            self._owns_conn = True
            self.outage.recovered()
            log.info("listening for desired-state notifications", channel=self.channel)
            # Whatever was published while we were not listening was never
            # delivered to us: one wake-up makes the loop look now.
            self.wake("reconnect")
            try:
                await self._serve(conn)
            except Exception as exc:  # noqa: BLE001 - logged; polling covers the gap
                self._report_reconnecting(True)
                self.outage.failed(error=self._describe(exc), url=redact(self.url))
            finally:
                self.metrics.listen_connected.set(0)
                if self._owns_conn:
                    await _close(conn)
            await self._sleep_unless_poked(self.backoff.next())

    def _report_reconnecting(self, on: bool) -> None:
        if on != self._reported_reconnecting:
            self._reported_reconnecting = on
            self._reconnecting(on)

    async def _park_on_standby(self) -> None:
        """Idle while the server is a hot standby: an outage it is not, so no error lines."""
        self.outage.recovered()
        self.backoff.reset()
        if not self.standby_reported:
            self.standby_reported = True
            log.info(
                "the control plane is a hot standby: LISTEN cannot run during recovery and "
                "NOTIFY is not replicated; converging by polling alone",
                url=redact(self.url),
                recheck_s=STANDBY_RECHECK_S,
            )
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

        The connect and the setup are two calls, as the store's open and setup
        are (:class:`~supervisor.controlplane.runner.ConnectionRunner`): a
        connect given up on is abandoned (libpq's ``connect_timeout`` ends its
        thread, and the connection is closed if it ever completes); a setup
        given up on has its socket shut down, so its thread returns at once.
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
        _refuse_standby(conn)
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
        a held wake-up go ("released"): which one came. The socket is read meanwhile,
        whatever is held: a session that fell behind would keep the server's
        notification queue from being truncated, and a full queue fails every
        NOTIFY of the cluster."""
        woken = "timeout"
        async with trio.open_nursery() as nursery:

            async def released() -> None:
                nonlocal woken
                if not self.floor.held:
                    return
                await self.floor.release()
                woken = "released"
                nursery.cancel_scope.cancel()

            async def readable() -> None:
                nonlocal woken
                await trio.lowlevel.wait_readable(fd)
                woken = "readable"
                nursery.cancel_scope.cancel()

            async def poked() -> None:
                nonlocal woken
                if await self._poked_within(self.probe_interval_s):
                    woken = "poke"
                nursery.cancel_scope.cancel()

            nursery.start_soon(readable)
            nursery.start_soon(poked)
            nursery.start_soon(released)
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
                await call_interruptibly(
                    partial(conn.execute, "SELECT 1"),
                    interrupt=partial(conn.cancel_safe, timeout=INTERRUPT_GRACE_S),
                    dispose=conn.close,
                )
            except trio.Cancelled:
                # Shutdown or the probe deadline: the abandoned worker thread
                # now owns the connection and closes it when the driver returns.
                self._owns_conn = False
                raise
        if deadline.cancelled_caught:
            raise _ConnectionLost(f"no answer to a probe within {PROBE_TIMEOUT_S:g} s")
        self.backoff.reset()


def _refuse_standby(conn: Conn) -> None:
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    if row is not None and row[0] is True:
        raise _InRecovery


async def _close(conn: Conn) -> None:
    if not conn.closed:
        # Wake (with ClosedResourceError) any task still waiting on this socket
        # before the descriptor is closed and its number reused.
        try:
            trio.lowlevel.notify_closing(conn.fileno())
        except psycopg.Error:
            pass
    with trio.move_on_after(INTERRUPT_GRACE_S, shield=True):
        try:
            await in_db_thread(conn.close, "closing the LISTEN connection")
        except Exception as exc:  # noqa: BLE001 - the connection is gone either way
            log.debug("closing the LISTEN connection failed", error=str(exc))
