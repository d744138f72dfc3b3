"""Children for the supervision tree's tests (they run under virtual time).

:class:`FaultSwitch` wraps any child's start function (a :class:`supervisor.tree.StartFn`)
and runs the real one inside a nursery of its own. :meth:`FaultSwitch.crash` raises
:class:`InjectedFault` in that nursery, as a real fault would: the child's tasks are
cancelled, its ``finally`` blocks run, and the tree sees a crash. With ``hang_next_start``
the restart then hangs before reporting started, as a start stuck on something would;
a later crash ends the hang. The tree has no hook for any of it; ``python -m
tests.faultdaemon`` puts every child of the real daemon behind one.
"""

from __future__ import annotations

import trio

from supervisor.tree import StartFn


class Crasher:
    """A child that starts, then crashes after ``after_s``; records its start times."""

    def __init__(self, after_s: float = 1.0, crashes: int = 10**9) -> None:
        self.after_s = after_s
        self.crashes = crashes
        self.starts: list[float] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(trio.current_time())
        task_status.started()
        await trio.sleep(self.after_s)
        if len(self.starts) <= self.crashes:
            raise RuntimeError(f"crash #{len(self.starts)}")
        await trio.sleep_forever()


class InjectedFault(RuntimeError):
    """A crash made on purpose by a test (:meth:`FaultSwitch.crash`)."""


class FaultSwitch:
    """``start`` of child ``name``, with a crash (and a hung restart) at the test's call."""

    def __init__(self, name: str, start: StartFn) -> None:
        self.name = name
        self._start = start
        self._nursery: trio.Nursery | None = None
        self._hang_next_start = False

    async def __call__(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                       ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._hang_next_start:
                    self._hang_next_start = False
                    await trio.sleep_forever()
                await nursery.start(self._start)
                task_status.started()
        finally:
            self._nursery = None

    def crash(self, *, hang_next_start: bool = False) -> bool:
        """Crash the running child; False when it is not running (nothing to crash)."""
        if self._nursery is None:
            return False
        self._hang_next_start = hang_next_start

        async def fault() -> None:
            raise InjectedFault(f"fault injected into child {self.name!r} by a test")

        self._nursery.start_soon(fault)
        return True
