"""The reload hook (``[hook].command``): a program run after each swap, as consul-template runs one.

Operators: docs/operations.md, "The reload hook".
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import msgspec
import trio

from supervisor.backoff import Backoff
from supervisor.events import utc_now_iso
from supervisor.logs import get_logger
from supervisor.sinks.state import ActiveState
from supervisor.status_doc import HookReport
from supervisor.streak import Streak
from supervisor.telemetry import Metrics
from supervisor.wakeup import Wakeup

__all__ = ["OUTPUT_GRACE_S", "OUTPUT_KEPT", "HookRun", "ReloadHook", "run_command"]

log = get_logger("hook")

#: How much of a run's output is kept for ``/status``.
OUTPUT_KEPT = 4096
RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 300.0
_NOT_PASSED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
# How long a killed group may take to be reaped before it is left to the kernel.
_REAP_S = 5.0
#: How long the output is read once the command exited (a child it left may hold the pipe).
OUTPUT_GRACE_S = 1.0


@dataclass(frozen=True)
class HookRun:
    """How one run ended: ``outcome`` is a label of ``reasons.HOOK_OUTCOMES``."""

    outcome: str
    exit_code: int | None
    duration_s: float
    output: str


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


async def run_command(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> HookRun:
    """Run ``argv`` once, bounded; never raises but Cancelled.

    No shell; stdin from ``/dev/null``. The environment is ``env`` (see ReloadHook).
    The command leads a session of its own. Its whole process group is killed at
    ``timeout_s`` or on cancellation while the command runs. The run ends when the
    command exits: its output is read for :data:`OUTPUT_GRACE_S` more, and a child it
    left holding the pipe (a service it started) keeps running until it writes to the
    pipe: closed then, it gets SIGPIPE. Output (stdout and stderr, one pipe) is kept up
    to :data:`OUTPUT_KEPT` bytes; the rest is read and discarded.
    """
    started = trio.current_time()
    try:
        process = await trio.lowlevel.open_process(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)
    except OSError as exc:
        return HookRun("error", None, 0.0, f"cannot start {argv[0]}: {exc}")
    kept = bytearray()
    stdout = process.stdout
    assert stdout is not None

    async def read() -> None:
        async for chunk in stdout:
            if len(kept) < OUTPUT_KEPT:
                kept.extend(chunk[:OUTPUT_KEPT - len(kept)])

    finished = False
    try:
        with trio.move_on_after(timeout_s):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await process.wait()
                finished = True
                # A child it started may hold the pipe for good: its output is the
                # command's no longer.
                nursery.cancel_scope.deadline = trio.current_time() + OUTPUT_GRACE_S
    finally:
        if not finished:  # the timeout, or the daemon stopping
            _kill_group(process.pid)
        with trio.move_on_after(_REAP_S, shield=True):
            await stdout.aclose()
            await process.wait()
    took = trio.current_time() - started
    code = process.returncode
    text = kept.decode("utf-8", "replace")
    if not finished:
        return HookRun("timeout", code, took, text)
    return HookRun("ok" if code == 0 else "failed", code, took, text)


Runner = Callable[[Sequence[str], Mapping[str, str], float], Awaitable[HookRun]]


class ReloadHook:
    """Runs ``command`` after swaps of ``state``, in a task of its own.

    :meth:`swapped` never waits, so convergence never waits on the hook.

    - The daemon's environment (less ``NOTIFY_SOCKET`` and the watchdog's variables)
      plus ``SUPERVISOR_REVISION``, ``SUPERVISOR_SEQUENCE`` (empty: unknown) and
      ``SUPERVISOR_SNAPSHOT`` (the snapshot file's path; empty: none).
    - One run at a time, coalesced: swaps during a run leave one run due, for the
      revision serving when it starts.
    - A failed run is retried with backoff (1 s doubling to 5 min). A newer swap runs
      at once; the backoff is kept until a run succeeds.
    - Bounded as :func:`run_command` says.

    Its last run is ``/status`` ``sinks.hook``; each run counts in
    ``supervisor_hook_runs_total{outcome}``. Failures are a streak
    (:mod:`supervisor.streak`): one line when they begin, one on recovery.
    """

    def __init__(self, command: Sequence[str], timeout_s: float, *, state: ActiveState,
                 metrics: Metrics, snapshot_path: str | None,
                 backoff: Backoff | None = None, environ: Mapping[str, str] | None = None,
                 runner: Runner | None = None) -> None:
        self.command = tuple(command)
        self.timeout_s = timeout_s
        self.state = state
        self.metrics = metrics
        self.snapshot_path = snapshot_path
        self.backoff = backoff or Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
        self._environ = environ
        # How a run happens: :func:`run_command` (a test gives a stand-in process).
        self._runner = runner or run_command
        # Counts the swaps: a run is due while it moved past what the last run started after.
        self._swaps = Wakeup()
        self._failures = Streak(log, began="reload hook failed; retrying with backoff",
                                ended="reload hook recovered", count_as="runs")
        self._report = HookReport()

    def swapped(self) -> None:
        """A new snapshot serves: a run is due (coalesced with any already due)."""
        self._swaps.wake()

    def report(self) -> HookReport:
        return self._report

    def _environment(self, revision: int | None, sequence: int | None) -> dict[str, str]:
        env = dict(os.environ if self._environ is None else self._environ)
        for name in _NOT_PASSED:  # systemd's word is for the daemon, not its hook
            env.pop(name, None)
        env.update(SUPERVISOR_REVISION="" if revision is None else str(revision),
                   SUPERVISOR_SEQUENCE="" if sequence is None else str(sequence),
                   SUPERVISOR_SNAPSHOT=self.snapshot_path or "")
        return env

    async def run_once(self) -> HookRun:
        """One run for what serves now, recorded in the report, the metric and the log."""
        snapshot = self.state.snapshot
        revision = snapshot.revision if snapshot is not None else None
        sequence = self.state.sequence
        self._report = msgspec.structs.replace(self._report, running=True)
        run = await self._runner(self.command, self._environment(revision, sequence),
                                self.timeout_s)
        self.metrics.hook_runs.labels(run.outcome).inc()
        fields = {"revision": revision, "sequence": sequence, "outcome": run.outcome,
                  "exit_code": run.exit_code, "duration_s": round(run.duration_s, 3)}
        if run.outcome == "ok":
            self._failures.recovered(**fields)
            log.info("reload hook ran", **fields)
        else:
            self._failures.failed(output=run.output[:1024], **fields)
        self._report = HookReport(
            state="failing" if self._failures.ongoing else "ok", running=False,
            revision=revision, sequence=sequence, outcome=run.outcome, exit_code=run.exit_code,
            duration_s=round(run.duration_s, 3), output=run.output, finished_at=utc_now_iso())
        return run

    async def run(self) -> None:
        """Run the hook whenever one is due, forever (until cancelled)."""
        seen = 0
        while True:
            await self._swaps.wait(math.inf, since=seen)
            seen = self._swaps.count
            run = await self.run_once()
            if run.outcome == "ok":
                self.backoff.reset()
                continue
            await self._swaps.wait(self.backoff.next(), since=seen)  # a newer swap runs at once
            seen = -1  # the retry is due either way
