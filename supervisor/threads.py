"""Every blocking call waits in a worker thread of its dependency's own limit, under a deadline.

:func:`in_thread` is the one hand-off; :data:`THREAD_LIMITS` and
:data:`FILE_IO_DEADLINE_S` its bounds; :func:`outliving` what a stuck
dependency still holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, Generic, Literal, TypeVar

import trio

from supervisor.logs import get_logger

__all__ = ["FILE_IO_DEADLINE_S", "THREAD_LIMITS", "Dependency", "ThreadDeadline", "in_thread",
           "outliving", "thread_limiter"]

T = TypeVar("T")

#: Worker threads each dependency may hold at once. A thread abandoned at its
#: deadline keeps its token until its call returns, so a stuck dependency
#: exhausts its own limit and never trio's shared one (40), which the others
#: would wait on.
THREAD_LIMITS: Final[dict[Dependency, int]] = {
    "database": 8, "files": 4, "reload": 2, "kube": 2, "cpu": 4}
#: File I/O on a sink or a state file (a revision body written or read whole).
FILE_IO_DEADLINE_S: Final = 60.0

_limiters: trio.lowlevel.RunVar[dict[str, trio.CapacityLimiter]] = trio.lowlevel.RunVar(
    "thread_limiters")
_lock = threading.Lock()
_outliving: dict[str, int] = {}
_log = get_logger("threads")


class ThreadDeadline(TimeoutError):
    """``what`` did not return within ``deadline_s`` (waiting for a thread included)."""

    def __init__(self, what: str, deadline_s: float) -> None:
        self.what, self.deadline_s = what, deadline_s
        super().__init__(f"{what} timed out after {deadline_s:g} s")


def thread_limiter(dependency: Dependency) -> trio.CapacityLimiter:
    """The worker-thread limit of ``dependency`` (a key of :data:`THREAD_LIMITS`), per run."""
    try:
        limiters = _limiters.get()
    except LookupError:
        limiters = {}
        _limiters.set(limiters)
    if dependency not in limiters:
        limiters[dependency] = trio.CapacityLimiter(THREAD_LIMITS[dependency])
    return limiters[dependency]


def outliving() -> dict[str, int]:
    """Per dependency, the worker threads still running after their caller gave up."""
    with _lock:
        return {dep: n for dep, n in sorted(_outliving.items()) if n}


class _Handoff(Generic[T]):
    """One call in a worker thread; counted in :func:`outliving` once abandoned while running."""

    def __init__(self, fn: Callable[[], T], dependency: str, what: str) -> None:
        self.fn, self.dependency, self.what = fn, dependency, what
        self.started = self.done = False
        self.abandoned_at: float | None = None

    def run(self) -> T:
        with _lock:
            if self.done:
                # Given up between taking its token and starting: the caller has gone.
                raise ThreadDeadline(self.what, 0)
            self.started = True
        try:
            return self.fn()
        finally:
            with _lock:
                self.done = True
                late = self.abandoned_at
                if late is not None:
                    _outliving[self.dependency] -= 1
            if late is not None:
                _log.info("worker thread returned after its caller gave up",
                          dependency=self.dependency, what=self.what,
                          late_s=round(time.monotonic() - late, 3))

    def abandon(self) -> None:
        with _lock:
            if self.done or not self.started:
                # Never started (cancelled waiting for a token): it never will.
                self.done = True
                return
            self.abandoned_at = time.monotonic()
            _outliving[self.dependency] = _outliving.get(self.dependency, 0) + 1
        _log.info("worker thread still running after its caller gave up",
                     dependency=self.dependency, what=self.what)


async def in_thread(fn: Callable[[], T], *, dependency: Dependency, deadline_s: float,
                    what: str) -> T:
    """``fn()`` in a worker thread of ``dependency``'s limit, within ``deadline_s``.

    The deadline covers the wait for a thread too. At the deadline (then
    :class:`ThreadDeadline`) or on cancellation the caller returns at once and
    the thread runs on, holding its token, until ``fn`` returns: it is logged
    and counted in :func:`outliving` meanwhile. Releasing what blocks it (a
    socket shut down) is the caller's job.
    """
    handoff = _Handoff(fn, dependency, what)
    with trio.move_on_after(deadline_s):
        try:
            return await trio.to_thread.run_sync(
                handoff.run, abandon_on_cancel=True, limiter=thread_limiter(dependency))
        except trio.Cancelled:
            handoff.abandon()
            raise
    raise ThreadDeadline(what, deadline_s)


#: The names of :data:`THREAD_LIMITS`, as the type of a hand-off's ``dependency``: a
#: name not in the table fails the type check, not the first call.
Dependency = Literal["database", "files", "reload", "kube", "cpu"]
