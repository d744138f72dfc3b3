"""SIGTERM, SIGINT and SIGHUP, as the daemon's lifecycle sees them.

The receiver is installed first thing in :func:`supervisor.app.run_daemon`,
before anything slow: as PID 1 in a container the kernel drops signals that
have no handler. SIGINT is caught here too, so ``KeyboardInterrupt`` never
surfaces at an arbitrary await.

- First SIGTERM/SIGINT: graceful shutdown, bounded by ``shutdown_grace_s``.
- Second SIGTERM/SIGINT: cancel everything now.
- SIGHUP: re-read the log level, then run every registered hook (the
  convergence loop registers "converge now").
"""

from __future__ import annotations

import signal
from collections.abc import Callable

__all__ = ["HANDLED", "HupHooks"]

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class HupHooks:
    """Callbacks run on SIGHUP. A hook that raises is logged, never fatal."""

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

