"""Crash drills (tests only): SIGUSR2 plus a file ``crash-<child>`` crashes that child.

:func:`run_fault_injection` runs only when the daemon is given a fault
directory (``SUPERVISOR_TEST_FAULT_DIR``); otherwise SIGUSR2 keeps its default
disposition and nothing here runs. Each SIGUSR2 reads the directory, removes
every ``crash-<child>`` and ``hang-<child>`` file and calls
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

__all__ = ["FAULT_DIR_ENV", "run_fault_injection"]

log = get_logger("daemon")

FAULT_DIR_ENV = "SUPERVISOR_TEST_FAULT_DIR"


async def run_fault_injection(fault_dir: str, inject: Callable[[str, bool], bool]) -> None:
    with trio.open_signal_receiver(signal.SIGUSR2) as receiver:
        async for _ in receiver:
            try:
                names = sorted(os.listdir(fault_dir))
            except OSError as exc:
                log.error("fault injection: cannot read the fault directory",
                          path=fault_dir, error=str(exc))
                continue
            for entry in names:
                fault, _, child = entry.partition("-")
                if fault not in ("crash", "hang") or not child:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(fault_dir, entry))
                injected = inject(child, fault == "hang")
                log.warning("fault injection", child=child, fault=fault, injected=injected)
