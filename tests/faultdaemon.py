"""``python -m tests.faultdaemon``: the real daemon, every child behind a fault switch.

It takes what ``python -m supervisor`` takes and runs the same command line; only
the supervision tree's start functions are wrapped in :class:`~tests.fakes.children.FaultSwitch`.
When ``SUPERVISOR_TEST_FAULT_DIR`` names a directory, each SIGUSR2 reads it, removes
every ``crash-<child>`` and ``hang-<child>`` file and crashes that child (``hang``:
its restart then hangs before reporting started). :func:`tests.proc.run_daemon`
starts this module instead of ``supervisor`` when its environment names the directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import replace

import trio

from supervisor import app
from supervisor.cli import main
from supervisor.config import Config
from supervisor.logs import get_logger
from supervisor.tree import Supervisor
from tests.fakes.children import FaultSwitch
from tests.proc import FAULT_DIR_ENV

__all__ = ["FaultDaemon", "run_fault_daemon"]

log = get_logger("faults")


class FaultDaemon(app.Daemon):
    """The daemon whose tree's children can be crashed through their :class:`FaultSwitch`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.switches: dict[str, FaultSwitch] = {}

    def build_tree(self) -> Supervisor:
        tree = super().build_tree()
        self.switches = {spec.name: FaultSwitch(spec.name, spec.start) for spec in tree.specs}
        tree.specs[:] = [replace(spec, start=self.switches[spec.name]) for spec in tree.specs]
        return tree

    async def run(self) -> None:
        """The daemon's run, beside the SIGUSR2 receiver (its errors reach the command line
        inside one more exception group, which it looks through)."""
        fault_dir = os.environ.get(FAULT_DIR_ENV)
        async with trio.open_nursery() as nursery:
            if fault_dir:
                nursery.start_soon(self._faults, fault_dir)
            try:
                await super().run()
            finally:
                nursery.cancel_scope.cancel()

    async def _faults(self, fault_dir: str) -> None:
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
                    switch = self.switches.get(child)
                    injected = switch is not None and switch.crash(hang_next_start=fault == "hang")
                    log.warning("fault injection", child=child, fault=fault, injected=injected)


async def run_fault_daemon(config: Config, config_path: str | None = None) -> None:
    await FaultDaemon(config, config_path).run()


if __name__ == "__main__":
    # The command line's `run` starts app.run_daemon; here it starts the FaultDaemon.
    app.run_daemon = run_fault_daemon
    raise SystemExit(main())
