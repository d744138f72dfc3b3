"""SIGTERM, SIGINT and SIGHUP, as the daemon's lifecycle sees them.

The receiver is installed first thing in :func:`supervisor.app.run_daemon`,
before anything slow: as PID 1 in a container the kernel drops signals that
have no handler. SIGINT is caught here too, so ``KeyboardInterrupt`` never
surfaces at an arbitrary await.

- First SIGTERM/SIGINT: graceful shutdown, bounded by ``shutdown_grace_s``.
- Second SIGTERM/SIGINT: cancel everything now.
- SIGHUP: re-read the log level, then run every registered hook (the
  convergence loop registers "converge now").
- SIGUSR2 (tests' crash drills only): :func:`run_fault_injection` runs only when
  the daemon is given a fault directory (``SUPERVISOR_TEST_FAULT_DIR``);
  otherwise SIGUSR2 keeps its default disposition. Each SIGUSR2 reads the
  directory, removes every ``crash-<child>`` and ``hang-<child>`` file and calls
  ``inject(child, hang_next_start)`` (the supervision tree's injected fault):
  ``hang-<child>`` crashes the child too, and its restart then hangs before
  reporting started. An unreadable directory is logged, never fatal.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

import trio

from supervisor.logs import get_logger

__all__ = ["FAULT_DIR_ENV", "HANDLED", "HupHooks", "run_fault_injection"]

log = get_logger("daemon")

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FAULT_DIR_ENV = "SUPERVISOR_TEST_FAULT_DIR"


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


async def run_fault_injection(fault_dir: str, inject: Callable[[str, bool], bool]) -> None:
    with trio.open_signal_receiver(signal.SIGUSR2) as receiver:
        async for _ in receiver:
            try:
                names = sorted(os.listdir(fault_dir))
            except OSError as exc:
                log.error(
                    "fault injection: cannot read the fault directory",
                    path=fault_dir,
                    error=str(exc),
                )
                continue
            for entry in names:
                fault, _, child = entry.partition("-")
                if fault not in ("crash", "hang") or not child:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(fault_dir, entry))
                injected = inject(child, fault == "hang")
                log.warning("fault injection", child=child, fault=fault, injected=injected)
