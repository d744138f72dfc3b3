"""The supervision tree: one-for-one restarts of long-lived children."""

from __future__ import annotations

import enum
import random
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog
import trio

from supervisor.backoff import Backoff
from supervisor.errors import BootRefused, ConfigError, StartError, SupervisionGaveUp, find_leaf
from supervisor.logs import get_logger
from supervisor.status_doc import ChildReport, ChildStateName, ChildSubstate

__all__ = ["ChildSpec", "ChildState", "Restart", "StartFn", "Supervisor"]

log = get_logger("tree")

BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0


class StartFn(Protocol):
    """A child: started with ``nursery.start``, reports ``task_status.started()`` when up.

    ::

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            ... set up ...
            task_status.started()       # "I am serving": readiness is explicit
            ... serve until cancelled ...
    """

    def __call__(self, *, task_status: trio.TaskStatus[None] = ...) -> Awaitable[None]: ...


class Restart(enum.Enum):
    """When a child restarts, as OTP's one_for_one: only the crashed child, siblings run on.

    ``permanent``: always, also when it returns. ``transient``: only when it crashes.
    ``temporary``: never.
    """
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


@dataclass(frozen=True)
class ChildSpec:
    """A child: its name, start function, restart type and shutdown timeout."""
    name: str
    start: StartFn
    restart: Restart = Restart.PERMANENT
    shutdown_timeout_s: float = 5.0


@dataclass
class ChildState:
    """What the status report shows of one child."""

    state: ChildStateName = "starting"
    # trio.current_time() when ``state`` was entered (set when supervision
    # begins: the tree may be built outside trio).
    since: float = 0.0
    # Seconds spent ``starting`` in earlier attempts since the child last ran:
    # a start that hangs and then fails (a timeout) restarts into another, and
    # the child is down for all of them, not for the current attempt alone.
    starting_before: float = 0.0
    restarts: int = 0
    last_error: str | None = None
    # What a running child says of itself (Supervisor.report_substate): shown
    # in place of ``running``, forgotten when the child leaves ``running``.
    substate: ChildSubstate | None = None
    recent: deque[float] = field(default_factory=deque)
    started: bool = False
    entered: bool = False
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)

    def report(self) -> ChildReport:
        state = self.substate if self.state == "running" and self.substate else self.state
        return ChildReport(state=state, restarts=self.restarts, last_error=self.last_error)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# No restart fixes these: a bad configuration, a refused boot, an address in use.
_FATAL = (ConfigError, BootRefused, StartError)


class Supervisor:
    def __init__(self, specs: list[ChildSpec], *, intensity: int, period_s: float,
                 on_restart: Callable[[str], None] | None = None,
                 on_change: Callable[[], None] | None = None,
                 rng: random.Random | None = None) -> None:
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate child names in {names}")
        self.specs = list(specs)
        self.intensity = intensity
        self.period_s = period_s
        self.children: dict[str, ChildState] = {spec.name: ChildState() for spec in specs}
        self._on_restart = on_restart
        self._on_change = on_change
        self._rng = rng or random.Random()

    # -- reading -------------------------------------------------------------

    def report(self) -> dict[str, ChildReport]:
        return {name: child.report() for name, child in self.children.items()}

    def report_substate(self, name: str, substate: ChildSubstate | None) -> None:
        """A running child's word on itself (``reconnecting``), or None: plainly ``running``.

        Only the report shows it: restarts, liveness and readiness follow the
        tree's own state. Said while not running, it is ignored.
        """
        child = self.children[name]
        substate = substate if child.state == "running" else None
        if child.substate != substate:
            child.substate = substate
            if self._on_change is not None:
                self._on_change()

    def stuck_starting(self, limit_s: float) -> dict[str, float]:
        """Children restarted and still ``starting`` after ``limit_s``: name -> seconds so far.

        Only a restart counts: a first start is the caller's start-up, which readiness
        covers. The seconds add up every attempt ``starting`` since the child last ran,
        backoff waits excluded: restarts that each hang, then fail, never run either.
        ``/healthz`` and the watchdog count such a child as down.
        """
        now = trio.current_time()
        stuck: dict[str, float] = {}
        for name, child in self.children.items():
            if child.state == "starting" and child.started:
                for_s = child.starting_before + now - child.since
                if for_s > limit_s:
                    stuck[name] = for_s
        return stuck

    @property
    def crash_looping(self) -> bool:
        """True while some child waits to restart after two or more recent crashes."""
        return any(c.state == "backoff" and len(c.recent) >= 2 for c in self.children.values())

    # -- running -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every child until cancelled, or until one exceeds the restart intensity.

        Starts the children in order, each with ``nursery.start``, and reports started once
        every child has: what ``READY=1`` waits for.

        A crash is logged once, with its traceback, then restarted after a backoff with
        jitter (``BACKOFF_INITIAL_S`` doubling to ``BACKOFF_MAX_S``). More than ``intensity``
        restarts of one child within ``period_s`` raise
        :class:`~supervisor.errors.SupervisionGaveUp`: exit 4, so systemd or Kubernetes
        restart the process whole. ConfigError, BootRefused and StartError are not restarted:
        they end the process with their own exit code (a port in use exits 1, which systemd
        retries). ``trio.Cancelled`` is never caught, so shutdown always unwinds.
        """
        async with trio.open_nursery() as nursery:
            for spec in self.specs:
                await nursery.start(self._supervise, spec)
            task_status.started()

    async def shutdown(self) -> None:
        """Stop children in reverse start order, each within its shutdown timeout.

        Children clean up in ``finally`` blocks under ``trio.move_on_after(..., shield=True)``.
        """
        for spec in reversed(self.specs):
            child = self.children[spec.name]
            child.scope.cancel()
            if not child.entered:
                continue  # never started: nothing to wait for
            with trio.move_on_after(spec.shutdown_timeout_s, shield=True) as scope:
                await child.done.wait()
            if scope.cancelled_caught:
                log.warning("child did not stop in time", child=spec.name,
                            timeout_s=spec.shutdown_timeout_s)

    def _set(self, child: ChildState, state: ChildStateName) -> None:
        if child.state != state:
            now = trio.current_time()
            if state == "running":
                child.starting_before = 0.0
            elif child.state == "starting":
                child.starting_before += now - child.since
            child.state = state
            child.substate = None
            child.since = now
            if self._on_change is not None:
                self._on_change()

    async def _supervise(self, spec: ChildSpec, *,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        structlog.contextvars.bind_contextvars(child=spec.name)
        child = self.children[spec.name]
        child.entered = True
        child.since = trio.current_time()
        try:
            with child.scope:
                while True:
                    crashed: BaseException | None = None
                    try:
                        async with trio.open_nursery() as inner:
                            await inner.start(spec.start)
                            first = not child.started
                            child.started = True
                            self._set(child, "running")
                            if first:  # supervision is up once the child first started
                                task_status.started()
                    except Exception as exc:  # noqa: BLE001 - Cancelled is a BaseException: never caught
                        fatal = find_leaf(exc, _FATAL)
                        if fatal is not None:
                            # No restart can fix a bad configuration or a refused boot.
                            self._set(child, "failed")
                            raise fatal from None
                        crashed = exc
                    if crashed is None:
                        if spec.restart is not Restart.PERMANENT:
                            log.info("child finished", child=spec.name)
                            self._set(child, "stopped")
                            return
                        child.last_error = "returned while permanent"
                        log.warning("permanent child returned; restarting", child=spec.name)
                    else:
                        child.last_error = _describe(crashed)
                        log.error("child crashed", child=spec.name, error=child.last_error,
                                  traceback="".join(traceback.format_exception(crashed)))
                        # Not kept across the backoff: its frames hold what the
                        # crashed run owned.
                        crashed = None
                        if spec.restart is Restart.TEMPORARY:
                            self._set(child, "failed")
                            if not child.started:
                                task_status.started()
                            return
                    await self._before_restart(spec, child)
        finally:
            child.done.set()

    async def _before_restart(self, spec: ChildSpec, child: ChildState) -> None:
        now = trio.current_time()
        child.recent.append(now)
        while child.recent and child.recent[0] <= now - self.period_s:
            child.recent.popleft()
        if len(child.recent) > self.intensity:
            self._set(child, "failed")
            log.critical("restart intensity exceeded; giving up", child=spec.name,
                         restarts=len(child.recent), period_s=self.period_s)
            raise SupervisionGaveUp(spec.name, len(child.recent), self.period_s)
        child.restarts += 1
        if self._on_restart is not None:
            self._on_restart(spec.name)
        # Grows with the crashes still inside the period, not with a streak:
        # a child that crashes once a day always restarts after ~0.5 s.
        delay = Backoff(BACKOFF_INITIAL_S, BACKOFF_MAX_S, self._rng,
                        jitter=(0.8, 1.2)).after(len(child.recent) - 1)
        self._set(child, "backoff")
        log.info("restarting child", child=spec.name, delay_s=round(delay, 3),
                 restarts=child.restarts)
        await trio.sleep(delay)
        self._set(child, "starting")
