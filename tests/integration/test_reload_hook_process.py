"""The reload hook through a real daemon and a real hook script (SQLite control plane).

One script, its behaviour chosen by a file the test writes before each publish:
``record`` (its environment), ``hang`` (forks a child that keeps the output pipe
open, then sleeps), ``flood`` (prints 100 MB), ``fail`` (exit 7).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import trio

from supervisor.sinks.hook import OUTPUT_GRACE_S, OUTPUT_KEPT, HookRun, run_command
from tests.polling import poll_until
from tests.proc import REPO, Daemon, cli, free_port, run_daemon, write_config

SCRIPT = """#!/bin/sh
dir="$1"
env | grep '^SUPERVISOR_' | sort > "$dir/env.$SUPERVISOR_REVISION"
case "$(cat "$dir/mode")" in
  hang) sleep 1000 & echo $! > "$dir/child.pid"; echo $$ > "$dir/main.pid"; sleep 1000;;
  flood) head -c 100000000 /dev/zero | tr '\\0' x;;
  fail) echo "cannot reload"; exit 7;;
esac
echo "reloaded $SUPERVISOR_REVISION"
"""
# Long enough for a publish (a CLI process, seconds on a loaded machine) to finish
# while the hung run lasts.
TIMEOUT_S = 20.0


def _revision(tmp_path: Path, n: int) -> Path:
    path = tmp_path / f"rev{n}.toml"
    path.write_text(f'schema_version = 1\n[aliases.chat]\nupstream = "https://llm{n}.internal/v1"\n'
                    f'[keys.example]\nsecret = "file:{REPO}/conf/example.key"\n'
                    'aliases = ["chat"]\n')
    return path


def _gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def _hook_report(client: httpx.AsyncClient, base: str, revision: int,
                       outcome: str) -> dict[str, object]:
    """``/status`` ``sinks.hook`` once its last finished run is ``revision``'s, with ``outcome``."""
    found: dict[str, object] = {}

    async def finished() -> bool:
        hook = (await client.get(f"{base}/status")).json()["sinks"]["hook"]
        if hook["revision"] == revision and hook["outcome"] == outcome:
            found.update(hook)
        return bool(found)

    await poll_until(finished)
    return found


async def _publish(daemon: Daemon, config: Path, tmp_path: Path, n: int, mode: str) -> None:
    (tmp_path / "hook" / "mode").write_text(mode)
    await trio.to_thread.run_sync(
        lambda: cli("publish", "--config", str(config), str(_revision(tmp_path, n))))
    await daemon.wait_log("published", revision=n)


def _metric(text: str, outcome: str) -> float:
    needle = f'supervisor_hook_runs_total{{outcome="{outcome}"}} '
    return float(next(line for line in text.splitlines() if line.startswith(needle)).split()[-1])


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


async def test_hook_env_hang_fork_flood_and_failure_through_the_daemon(tmp_path: Path) -> None:
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    script = hook_dir / "hook.sh"
    script.write_text(SCRIPT)
    (hook_dir / "mode").write_text("record")
    port = free_port()
    snapshot = tmp_path / "snapshot.json"
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port,
                          poll_interval_s=0.2,
                          extra=f'[snapshot]\npath = "{snapshot}"\n'
                                f'[hook]\ncommand = ["/bin/sh", "{script}", "{hook_dir}"]\n'
                                f"timeout_s = {TIMEOUT_S}\n")
    cli("publish", "--config", str(config), str(_revision(tmp_path, 1)))
    base = f"http://127.0.0.1:{port}"
    with trio.fail_after(120):
        async with run_daemon(config) as daemon, httpx.AsyncClient(timeout=10) as client:
            await daemon.wait_log("ready")
            # The boot's swap runs the hook: its environment names what serves.
            first = await _hook_report(client, base, 1, "ok")
            assert first["exit_code"] == 0 and first["output"] == "reloaded 1\n"
            env = dict(line.split("=", 1) for line in
                       (hook_dir / "env.1").read_text().splitlines())
            assert env["SUPERVISOR_REVISION"] == "1" and env["SUPERVISOR_SNAPSHOT"] == str(snapshot)
            assert env["SUPERVISOR_SEQUENCE"].isdigit()
            assert json.loads(snapshot.read_text())["revision"] == 1

            # A hook that forks a child holding the pipe and hangs: its group is killed at
            # the timeout, and convergence goes on meanwhile (revision 3 published).
            await _publish(daemon, config, tmp_path, 2, "hang")
            await poll_until((hook_dir / "child.pid").exists)
            (hook_dir / "mode").write_text("record")
            await _publish(daemon, config, tmp_path, 3, "record")
            # From the log, not /status: revision 3's run may overwrite the report first.
            hung = await daemon.wait_log("reload hook failed; retrying with backoff",
                                         revision=2, outcome="timeout")
            events = [(line.get("event"), line.get("revision")) for line in daemon.lines]
            assert events.index(("published", 3)) < events.index(
                ("reload hook failed; retrying with backoff", 2)), "convergence waited on the hook"
            main, child = (int((hook_dir / f"{n}.pid").read_text()) for n in ("main", "child"))
            await poll_until(lambda: _gone(main) and _gone(child))
            # Killed at the timeout: the run lasted it, and not much longer.
            assert TIMEOUT_S <= float(str(hung["duration_s"])) < TIMEOUT_S + 5, hung
            # The swaps during the hung run coalesced into one run for the newest.
            await _hook_report(client, base, 3, "ok")

            # 100 MB of output: 4 KiB kept, the rest drained without the daemon growing.
            peak_before = _peak_rss_kib(daemon.process.pid)
            await _publish(daemon, config, tmp_path, 4, "flood")
            flood = await _hook_report(client, base, 4, "ok")
            assert flood["output"] == "x" * 4096
            growth_kib = _peak_rss_kib(daemon.process.pid) - peak_before
            print(f"daemon peak RSS growth while draining 100 MB of hook output: {growth_kib} KiB")
            assert growth_kib < 20 * 1024

            # A failure: retried with backoff (1 s, then 2 s ...) until it succeeds.
            await _publish(daemon, config, tmp_path, 5, "fail")
            failed = await _hook_report(client, base, 5, "failed")
            assert failed["exit_code"] == 7 and failed["state"] == "failing"
            assert failed["output"] == "cannot reload\n"
            await daemon.wait_log("reload hook failed; retrying with backoff", revision=5)
            (hook_dir / "mode").write_text("record")
            recovered = await _hook_report(client, base, 5, "ok")
            assert recovered["state"] == "ok"
            await daemon.wait_log("reload hook recovered", revision=5)
            metrics = (await client.get(f"{base}/metrics")).text
            assert _metric(metrics, "timeout") == 1 and _metric(metrics, "failed") >= 1
            assert _metric(metrics, "ok") >= 4
            daemon.signal()
            assert await daemon.wait() == 0


PATH_ONLY = {"PATH": "/usr/bin:/bin"}


@pytest.fixture
def pid_file(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``pid_file(name)``: a file a hook writes a pid to; that process is killed after the test."""
    made: list[Path] = []

    def make(name: str) -> Path:
        made.append(tmp_path / f"{name}.pid")
        return made[-1]

    yield make
    for path in made:
        if path.exists() and path.read_text().strip() and not _gone(pid := int(path.read_text())):
            os.kill(pid, signal.SIGKILL)


async def _sh(script: str, timeout_s: float = 15.0) -> HookRun:
    return await run_command(["/bin/sh", "-c", script], PATH_ONLY, timeout_s=timeout_s)


async def test_a_hook_that_leaves_a_child_holding_its_output_ends_with_its_exit(
        pid_file: Callable[[str], Path]) -> None:
    # A hook that starts a service: the service inherits the output pipe and keeps it open.
    # The run ends with the hook's own exit, its output read; the service is left running.
    child_pid = pid_file("child")
    with trio.fail_after(20):
        run = await _sh(f'sleep 1000 & echo $! > {child_pid}; echo "started"; exit 3')
    assert (run.outcome, run.exit_code, run.output) == ("failed", 3, "started\n")
    assert run.duration_s < 15.0 / 2, run
    assert not _gone(int(child_pid.read_text())), "the hook's child was killed with the run"


async def test_a_timeout_inside_the_grace_ends_the_run_as_the_command_exited(
        pid_file: Callable[[str], Path]) -> None:
    # The command exits 0.8 s before the timeout; its child holds the pipe, so the
    # timeout lands inside the output's grace: the outcome is still the command's exit,
    # and the child (not part of a hang) is left running.
    child_pid = pid_file("child")
    with trio.fail_after(20):
        run = await _sh(f"sleep 1000 & echo $! > {child_pid}; echo started; sleep 2; exit 4",
                        timeout_s=2.8)
    assert (run.outcome, run.exit_code, run.output) == ("failed", 4, "started\n"), run
    assert run.duration_s < 2.8 + 1, run
    assert not _gone(int(child_pid.read_text())), (
        "the timeout killed a group whose command had exited")


async def test_the_daemon_stopping_inside_the_grace_leaves_the_hooks_child_running(
        pid_file: Callable[[str], Path]) -> None:
    main_pid, child_pid = pid_file("main"), pid_file("child")
    script = f"sleep 1000 & echo $! > {child_pid}; echo $$ > {main_pid}; exit 0"
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                await _sh(script)
                raise AssertionError("the run outlived its cancellation")

            nursery.start_soon(run)
            await poll_until(lambda: main_pid.exists() and main_pid.read_text().strip() != "")
            await poll_until(lambda: _gone(int(main_pid.read_text())))
            nursery.cancel_scope.cancel()  # inside the output's grace
    assert not _gone(int(child_pid.read_text())), (
        "the stop killed the service the hook had started")


async def test_a_child_flooding_the_output_after_the_hook_exits_is_cut_at_the_grace(
        pid_file: Callable[[str], Path]) -> None:
    # Its output is read OUTPUT_GRACE_S more (the first OUTPUT_KEPT bytes kept), then no
    # longer: the flood ends on a broken pipe, and the run does not wait for it.
    child_pid = pid_file("child")
    with trio.fail_after(20):
        run = await _sh(f"(sleep 0.2; exec yes) & echo $! > {child_pid}; echo started; exit 0")
        assert (run.outcome, run.exit_code) == ("ok", 0), run
        assert run.output.startswith("started\ny\n") and len(run.output) == OUTPUT_KEPT
        assert OUTPUT_GRACE_S <= run.duration_s < OUTPUT_GRACE_S + 5, run
        await poll_until(lambda: _gone(int(child_pid.read_text())))


async def test_a_childs_late_write_to_the_output_ends_it_with_a_broken_pipe(
        pid_file: Callable[[str], Path]) -> None:
    # Past the grace the output is not read: a service the hook left holding it dies of
    # SIGPIPE on its next write (docs/operations.md: start it with its output elsewhere).
    quiet_pid, late_pid = pid_file("quiet"), pid_file("late")
    with trio.fail_after(20):
        run = await _sh(f"sleep 1000 >/dev/null 2>&1 & echo $! > {quiet_pid}; "
                        f"(sleep 3; echo late; sleep 1000) & echo $! > {late_pid}; echo started")
        assert (run.outcome, run.output) == ("ok", "started\n"), run
        await poll_until(lambda: _gone(int(late_pid.read_text())))
        assert not _gone(int(quiet_pid.read_text())), (
            "a service with its output elsewhere is left running")


async def test_output_still_in_the_pipe_when_the_hook_exits_is_kept_whole(
        pid_file: Callable[[str], Path]) -> None:
    child_pid = pid_file("child")
    with trio.fail_after(20):
        run = await _sh(f"sleep 1000 & echo $! > {child_pid}; "
                        f"head -c {OUTPUT_KEPT - 1} /dev/zero | tr '\\0' y; echo; exit 0")
    assert run.output == "y" * (OUTPUT_KEPT - 1) + "\n", run


async def test_a_hook_ended_by_a_signal_fails_with_the_signal_as_its_exit_code(
        pid_file: Callable[[str], Path]) -> None:
    child_pid = pid_file("child")
    with trio.fail_after(20):
        run = await _sh(f"sleep 1000 & echo $! > {child_pid}; echo bye; kill -TERM $$")
    assert (run.outcome, run.exit_code, run.output) == ("failed", -signal.SIGTERM, "bye\n")
