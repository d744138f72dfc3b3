"""SIGTERM, SIGINT and SIGHUP, as the daemon's lifecycle sees them.

The receiver and what each signal does: :meth:`supervisor.app.Daemon.run`.
SIGINT is caught too, so ``KeyboardInterrupt`` never surfaces at an arbitrary await.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

__all__ = ["HANDLED", "HupHooks"]

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class HupHooks:
    """Callbacks run on SIGHUP, after the log level is re-read.

    A hook that raises is logged, never fatal. The convergence loop registers
    "converge now".
    """

    def __init__(self) -> None:
        self._hooks: list[tuple[str, Callable[[], None]]] = []

    def register(self, name: str, hook: Callable[[], None]) -> None:
        self._hooks.append((name, hook))

    def run(self) -> list[tuple[str, Exception]]:
        failures: list[tuple[str, Exception]] = []
        for name, hook in self._hooks:
            try:
                hook()
            except Exception as exc:  # noqa: BLE001 - a hook's bug must not stop the daemon
                failures.append((name, exc))
        return failures

