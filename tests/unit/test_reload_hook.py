"""The reload hook: coalesced runs, retries with backoff, its report (virtual time).

The runner stands in for the process (what :func:`run_command` returns); the
process itself is in tests/integration/test_reload_hook_process.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import trio
import trio.testing

from supervisor.backoff import Backoff
from supervisor.revision.snapshot import Snapshot
from supervisor.sinks.hook import HookRun, ReloadHook
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics
from tests.convergence import sample
from tests.fakes.snapshot import serve


class Runner:
    """Records each run's environment and time; ``hold`` keeps a run going; fails ``fail`` first."""

    def __init__(self, fail: int = 0) -> None:
        self.runs: list[tuple[float, dict[str, str]]] = []
        self.hold: trio.Event | None = None
        self.fail = fail

    async def __call__(self, argv: Sequence[str], env: Mapping[str, str],
                       timeout_s: float) -> HookRun:
        self.runs.append((trio.current_time(), dict(env)))
        if self.hold is not None:
            await self.hold.wait()
        if self.fail:
            self.fail -= 1
            return HookRun("failed", 3, 0.1, "broken\n")
        return HookRun("ok", 0, 0.1, "done\n")


def _serve(state: ActiveState, revision: int, sequence: int) -> None:
    serve(state, Snapshot(revision=revision, generation=revision, aliases={}, keys={}),
               sequence=sequence)


def _hook(state: ActiveState, runner: Runner, metrics: Metrics) -> ReloadHook:
    return ReloadHook(["/bin/true"], 30.0, state=state, metrics=metrics,
                      snapshot_path="/run/snapshot.json", runner=runner,
                      environ={"PATH": "/bin", "NOTIFY_SOCKET": "/run/notify"},
                      backoff=Backoff(1.0, 8.0, jitter=(1.0, 1.0)))


async def test_swaps_during_a_run_coalesce_into_one_run_for_the_newest(
        autojump_clock: trio.testing.MockClock) -> None:
    state, runner, metrics = ActiveState(), Runner(), Metrics(process=False)
    hook = _hook(state, runner, metrics)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hook.run)
        _serve(state, 1, 10)
        runner.hold = trio.Event()
        hook.swapped()
        await trio.sleep(1)
        assert len(runner.runs) == 1 and hook.report().running
        for revision in (2, 3, 4):
            _serve(state, revision, 10 + revision)
            hook.swapped()  # never waits on the run in progress
        runner.hold.set()
        runner.hold = None
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert [env["SUPERVISOR_REVISION"] for _, env in runner.runs] == ["1", "4"]
    last = runner.runs[-1][1]
    assert last["SUPERVISOR_SEQUENCE"] == "14" and last["SUPERVISOR_SNAPSHOT"] == "/run/snapshot.json"
    assert last["PATH"] == "/bin" and "NOTIFY_SOCKET" not in last
    report = hook.report()
    assert (report.state, report.revision, report.outcome, report.exit_code) == ("ok", 4, "ok", 0)
    assert not report.running and report.output == "done\n"
    assert sample(metrics, "supervisor_hook_runs_total", outcome="ok") == 2


async def test_a_failed_run_is_retried_with_backoff_until_it_succeeds(
        autojump_clock: trio.testing.MockClock) -> None:
    state, runner, metrics = ActiveState(), Runner(fail=3), Metrics(process=False)
    hook = _hook(state, runner, metrics)
    _serve(state, 5, 7)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hook.run)
        hook.swapped()
        await trio.sleep(0.5)
        report = hook.report()
        assert (report.state, report.outcome, report.exit_code) == ("failing", "failed", 3)
        assert report.output == "broken\n"
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    times = [at for at, _ in runner.runs]
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
    assert gaps == [1.0, 2.0, 4.0], gaps  # then it succeeded: no fifth run
    assert hook.report().state == "ok"
    assert sample(metrics, "supervisor_hook_runs_total", outcome="failed") == 3
    assert sample(metrics, "supervisor_hook_runs_total", outcome="ok") == 1


async def test_a_newer_swap_cuts_the_retry_wait_short(
        autojump_clock: trio.testing.MockClock) -> None:
    state, runner = ActiveState(), Runner(fail=5)
    hook = _hook(state, runner, Metrics(process=False))
    hook.backoff = Backoff(100.0, 800.0, jitter=(1.0, 1.0))
    _serve(state, 1, 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hook.run)
        hook.swapped()
        await trio.sleep(5)
        _serve(state, 2, 2)
        hook.swapped()
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert [(at, env["SUPERVISOR_REVISION"]) for at, env in runner.runs] == [(0.0, "1"),
                                                                            (5.0, "2")]
