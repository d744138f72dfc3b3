"""Every child restarts and does its job again after crashes, through the real daemon process.

The drills of tests/integration/test_healing_process.py cover convergence,
the PostgreSQL ``listen`` child, ``admin`` and one fan-out watcher. These cover
the rest, each crashed twice by the test-only fault switch
(``SUPERVISOR_TEST_FAULT_DIR`` + SIGUSR2); after each restart the child does
its job again, and ``/healthz`` answers 503 naming it only while it is down:

- the elected ``fanout`` child (leader election on): re-acquires the Lease and
  fans out a parent created after the crash (fake API server as a process);
- the ``fanout-workflow`` watcher (leader election off): a Workflow created
  after the crash gets its batch/v1 CronJob;
- the follower's ``listen`` child (the upstream's ``/v1/stream`` as a wake-up
  hint): a publish on the upstream reaches the follower through the hint, with
  an hour's poll so that polling cannot explain it.

And "a child failed for good": every child is ``permanent`` (checked for every
configuration shape), so no child can stay failed while the daemon runs. What
exists instead is the crash loop: ``WATCHDOG=1`` stops while a child waits to
restart after repeated crashes, ``/healthz`` names it, and past the restart
intensity the daemon exits 4.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from supervisor.app import Daemon as App
from supervisor.configfile import load
from supervisor.tree import Restart
from tests.chaos.support import fake_apiserver_process
from tests.fakes.apiserver import FakeControl, write_kubeconfig
from tests.followers import make_node, wait_active
from tests.health import sample_health_blocking, status
from tests.polling import poll_until
from tests.proc import EXAMPLE, Daemon, NotifySocket, acli, free_port, run_daemon, write_config

GROUP = "platform.trio-supervisor.dev/v1"
CONTROL, APPS = "trio-supervisor", "apps"
LEASE = "trio-supervisor-fanout"
IDENTITY = "replica-drill"

Sample = tuple[int, dict[str, Any]] | None


def count(daemon: Daemon, event: str, **fields: Any) -> int:
    return sum(1 for line in daemon.lines if line.get("event") == event
               and all(line.get(k) == v for k, v in fields.items()))


def _more_lines(daemon: Daemon, seen: int) -> bool:
    return len(daemon.lines) > seen or daemon.process.returncode is not None


async def wait_after(daemon: Daemon, start: int, event: str, **fields: Any) -> int:
    """Index of the first line from ``start`` on with this event and fields (waits for it)."""
    checked = start
    while True:
        for index in range(checked, len(daemon.lines)):
            line = daemon.lines[index]
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items()):
                return index
        checked = len(daemon.lines)
        if daemon.process.returncode is not None:
            raise AssertionError(f"process exited before logging {event!r}:\n"
                                 + "\n".join(daemon.raw))
        await poll_until(partial(_more_lines, daemon, checked))


async def crash(daemon: Daemon, fault_dir: Path, child: str) -> None:
    (fault_dir / f"crash-{child}").touch()
    daemon.signal(signal.SIGUSR2)


async def drill(daemon: Daemon, fault_dir: Path, port: int, child: str, round_: int,
                job: Callable[[], Awaitable[None]]) -> None:
    """Crash ``child`` once, run ``job`` (its work after the restart), check /healthz.

    /healthz is sampled from a thread from before the crash until a 200 after
    the job: every 503 must name ``child``, at least one must be seen (it was
    down), and the first and last answers are 200.
    """
    seen: list[Sample] = []
    stop = threading.Event()
    async with trio.open_nursery() as nursery:
        # A worker thread cannot be cancelled: it stops on ``stop``, also on failure.
        nursery.start_soon(trio.to_thread.run_sync, sample_health_blocking, port, seen, stop)
        try:
            await poll_until(lambda: len(seen) >= 2)
            before = list(seen)
            await crash(daemon, fault_dir, child)
            await daemon.wait_log("child crashed", child=child)
            await daemon.wait_log("restarting child", child=child, restarts=round_)
            await job()
            after = len(seen)
            await poll_until(lambda: any(s is not None and s[0] == 200 for s in seen[after:]))
        finally:
            stop.set()
    assert before[:2] == [(200, {"ok": True})] * 2, before
    report = await status(port)
    assert report["children"][child]["state"] == "running"
    assert report["children"][child]["restarts"] == round_
    answered = [s for s in seen if s is not None]
    unhealthy = [body for code, body in answered if code == 503]
    assert unhealthy, f"/healthz never said {child} was down: {seen}"
    assert all(any(f"child {child} is" in reason for reason in body["unhealthy"])
               for body in unhealthy), unhealthy
    assert answered[-1] == (200, {"ok": True})


@asynccontextmanager
async def fake_kube(tmp_path: Path) -> AsyncIterator[tuple[FakeControl, Path]]:
    async with fake_apiserver_process(tmp_path / "apiserver.log") as server:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(server, kubeconfig)
        yield FakeControl(server.url), kubeconfig


def kube_config(tmp_path: Path, kubeconfig: Path, port: int, *, leader_election: bool) -> Path:
    extra = (f'\n[kubernetes]\nenabled = true\nkubeconfig = "{kubeconfig}"\n'
             f'control_namespace = "{CONTROL}"\napps_namespace = "{APPS}"\n'
             "preflight_retry_s = 1\n"
             f"leader_election = {'true' if leader_election else 'false'}\n"
             f'identity = "{IDENTITY}"\n'
             "lease_duration_s = 5\nrenew_deadline_s = 3\nretry_period_s = 0.5\n")
    return write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", extra, port=port)


def sd(name: str) -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": "ServiceDefinition",
            "metadata": {"name": name, "namespace": CONTROL},
            "spec": {"image": "nginx:1.27", "replicas": 1}}


def workflow(name: str) -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": "Workflow",
            "metadata": {"name": name, "namespace": CONTROL},
            "spec": {"image": "busybox:1.36", "schedule": "*/5 * * * *", "args": ["true"]}}


async def exists(control: FakeControl, plural: str, name: str) -> bool:
    return await control.get(plural, APPS, name) is not None


async def lease_holder(control: FakeControl) -> str | None:
    lease = await control.get("leases", CONTROL, LEASE)
    return None if lease is None else lease.get("spec", {}).get("holderIdentity")


async def test_the_elected_fanout_child_reacquires_the_lease_and_fans_out_after_two_crashes(
        tmp_path: Path) -> None:
    port = free_port()
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    env = {"SUPERVISOR_TEST_FAULT_DIR": str(fault_dir)}
    with trio.fail_after(60):
        async with fake_kube(tmp_path) as (control, kubeconfig):
            config = kube_config(tmp_path, kubeconfig, port, leader_election=True)
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            async with run_daemon(config, env=env) as daemon:
                await daemon.wait_log("ready", children=["admin", "convergence", "fanout"])
                await daemon.wait_log("fan-out leadership acquired", identity=IDENTITY)
                await control.create(sd("before"))
                await poll_until(lambda: exists(control, "deployments", "before"))
                for round_ in (1, 2):
                    async def job(round_: int = round_) -> None:
                        # Leading again: a second acquisition in the log (the crashed
                        # run released the Lease on its way out), and the Lease names us.
                        await poll_until(lambda: count(
                            daemon, "fan-out leadership acquired") == round_ + 1)
                        assert count(daemon, "fan-out lease released") == round_
                        assert await lease_holder(control) == IDENTITY
                        # And fanning out again: a parent created after the crash.
                        name = f"after-crash-{round_}"
                        await control.create(sd(name))
                        await poll_until(lambda: exists(control, "deployments", name))

                    await drill(daemon, fault_dir, port, "fanout", round_, job)
                    report = await status(port)
                    assert report["leadership"]["role"] == "leader"
                    assert report["fanout"]["ServiceDefinition"]["state"] == "watching"
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0


async def test_the_workflow_watcher_fans_out_cronjobs_after_two_crashes(tmp_path: Path) -> None:
    port = free_port()
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    env = {"SUPERVISOR_TEST_FAULT_DIR": str(fault_dir)}
    child = "fanout-workflow"
    with trio.fail_after(60):
        async with fake_kube(tmp_path) as (control, kubeconfig):
            config = kube_config(tmp_path, kubeconfig, port, leader_election=False)
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            async with run_daemon(config, env=env) as daemon:
                await daemon.wait_log("ready")
                await control.create(workflow("before"))
                await poll_until(lambda: exists(control, "cronjobs", "before"))
                for round_ in (1, 2):
                    async def job(round_: int = round_) -> None:
                        name = f"after-crash-{round_}"
                        await control.create(workflow(name))
                        await poll_until(lambda: exists(control, "cronjobs", name))
                        cronjob = await control.get("cronjobs", APPS, name)
                        assert cronjob is not None
                        assert cronjob["spec"]["schedule"] == "*/5 * * * *"
                        assert cronjob["metadata"]["labels"][
                            "platform.trio-supervisor.dev/workflow"] == name

                    await drill(daemon, fault_dir, port, child, round_, job)
                    report = await status(port)
                    # The sibling watcher was never touched (one-for-one).
                    assert report["children"]["fanout-servicedefinition"] == {
                        "state": "running", "restarts": 0, "last_error": None}
                    assert report["fanout"]["Workflow"]["state"] == "watching"
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0


async def test_the_follower_hint_child_wakes_the_loop_after_two_crashes(tmp_path: Path) -> None:
    upstream = make_node(tmp_path, "upstream", f"sqlite:///{tmp_path}/cp.db", [])
    follower = make_node(tmp_path, "follower", upstream.url, [upstream.verify_key])
    # An hour's poll: only the hint can make a publish reach the follower quickly.
    # Debug logs: the loop's "convergence attempt" lines name their trigger.
    text = follower.config.read_text()
    follower.config.write_text(text.replace("poll_interval_s = 0.3", "poll_interval_s = 3600")
                               .replace('level = "info"', 'level = "debug"'))
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    env = {"SUPERVISOR_TEST_FAULT_DIR": str(fault_dir)}
    await acli("db", "migrate", "--config", str(upstream.config))
    await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")
    following = "following the upstream's stream for wake-ups"
    with trio.fail_after(60):
        async with run_daemon(upstream.config) as up:
            await up.wait_log("published", revision=1)
            async with run_daemon(follower.config, env=env) as daemon:
                await daemon.wait_log(following)
                await wait_active(follower, 1)
                revision = 1
                for round_ in (1, 2):
                    async def job(round_: int = round_) -> None:
                        nonlocal revision
                        # The restarted child connects again; its reconnect wake-up
                        # is answered by an attempt before anything is published.
                        await poll_until(lambda: count(daemon, following) == round_ + 1)
                        start = [i for i, line in enumerate(daemon.lines)
                                 if line.get("event") == following][-1]
                        await wait_after(daemon, start, "convergence attempt",
                                         trigger="reconnect")
                        mark = len(daemon.lines)
                        await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")
                        revision += 1
                        await up.wait_log("published", revision=revision)
                        await wait_after(daemon, mark, "published", revision=revision)
                        # The attempt that published it (logged once it finished) was
                        # the first since the publish, and the hint's wake-up started it.
                        first = await wait_after(daemon, mark, "convergence attempt")
                        assert daemon.lines[first]["trigger"] == "upstream", daemon.lines[first]
                        assert daemon.lines[first]["revision"] == revision

                    await drill(daemon, fault_dir, follower.port, "listen", round_, job)
                    report = await status(follower.port)
                    assert report["revision"]["active"] == revision
                    assert report["children"]["convergence"]["restarts"] == 0
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0


async def test_a_crash_loop_stops_the_watchdog_and_exits_4_past_the_intensity(
        tmp_path: Path) -> None:
    """No child can stay failed while the daemon runs (see the next test); the state
    "restarting cannot help" is a crash loop: two crashes within the period stop
    WATCHDOG=1 for the restart's backoff, /healthz names the child, and a third crash
    (past restart_intensity = 2) ends the process with exit 4."""
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port)
    config.write_text(config.read_text().replace(
        "[supervisor]\n", "[supervisor]\nrestart_intensity = 2\nrestart_period_s = 3600\n"))
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    env = {"SUPERVISOR_TEST_FAULT_DIR": str(fault_dir), "NOTIFY_SOCKET": str(notify.path),
           "WATCHDOG_USEC": "200000"}  # a ping every 0.1 s
    pings: list[float] = []
    child = "convergence"

    async def running() -> bool:
        return bool((await status(port))["children"][child]["state"] == "running")

    with trio.fail_after(90):
        async with run_daemon(config, env=env) as daemon, trio.open_nursery() as nursery:
            await notify.wait_for("READY=1")

            async def pump() -> None:
                while True:
                    if "WATCHDOG=1" in await notify.receive():
                        pings.append(trio.current_time())

            nursery.start_soon(pump)
            await poll_until(lambda: len(pings) >= 3)
            # One crash: restarting helps, the pings go on (only /healthz says it is down).
            await crash(daemon, fault_dir, child)
            await daemon.wait_log("restarting child", child=child, restarts=1)
            await poll_until(running)
            # The second within the period: a crash loop. No ping while it waits.
            n = len(pings)
            await poll_until(lambda: len(pings) >= n + 3)
            await crash(daemon, fault_dir, child)
            await daemon.wait_log("restarting child", child=child, restarts=2)
            loop_from = trio.current_time()
            async with httpx.AsyncClient(timeout=5.0) as client:
                response = await client.get(f"http://127.0.0.1:{port}/healthz")
            await poll_until(running)
            loop_until = trio.current_time()
            assert response.status_code == 503
            assert any(reason.startswith(f"child {child} is backoff: InjectedFault")
                       for reason in response.json()["unhealthy"]), response.json()
            # A ping sent just before the crash may arrive just after: 0.15 s margin.
            window = (loop_from + 0.15, loop_until - 0.15)
            assert window[1] - window[0] >= 0.3, f"backoff too short to judge: {window}"
            during = [t for t in pings if window[0] < t < window[1]]
            assert not during, (f"{len(during)} WATCHDOG=1 pings in "
                                f"{window[1] - window[0]:.2f} s of crash loop")
            # Running again: the pings resume (restarting helped, for now).
            n = len(pings)
            await poll_until(lambda: len(pings) >= n + 2)
            # The third within the period: past the intensity, the process gives up.
            await crash(daemon, fault_dir, child)
            line = await daemon.wait_log("restart intensity exceeded; giving up")
            assert line["child"] == child and line["restarts"] == 3
            assert await daemon.wait() == 4
            nursery.cancel_scope.cancel()


def shapes(tmp_path: Path) -> dict[str, Path]:
    """One configuration per shape of the tree (which children exist)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [],
                                      "users": [], "contexts": []}))
    configs: dict[str, Path] = {}
    for name, url, extra, listen in (
        ("sqlite", f"sqlite:///{tmp_path}/cp.db", "", None),
        ("postgres-listen", "postgresql://u@127.0.0.1/db", "", True),
        ("kube", f"sqlite:///{tmp_path}/cp.db",
         f'[kubernetes]\nenabled = true\nkubeconfig = "{kubeconfig}"\nleader_election = false\n',
         None),
        ("kube-elected", f"sqlite:///{tmp_path}/cp.db",
         f'[kubernetes]\nenabled = true\nkubeconfig = "{kubeconfig}"\n', None),
    ):
        directory = tmp_path / name
        directory.mkdir()
        configs[name] = write_config(directory, url, extra, listen=listen)
    # A follower verifies what it receives: it needs a key (make_node makes one).
    unreachable_root = make_node(tmp_path, "follower-hint-root", "sqlite:///unused.db", [])
    configs["follower-hint"] = make_node(tmp_path, "follower-hint", "http://127.0.0.1:1",
                                         [unreachable_root.verify_key]).config
    return configs


@pytest.mark.parametrize("shape", ["sqlite", "postgres-listen", "follower-hint", "kube",
                                   "kube-elected"])
async def test_no_child_can_fail_for_good_while_the_daemon_runs(tmp_path: Path,
                                                                 shape: str) -> None:
    """A child is "failed" while the process runs only when it is transient or
    temporary (supervisor/tree.py); every other "failed" ends the process (a fatal
    error, or SupervisionGaveUp: exit 4). Every child of every tree is permanent,
    so /healthz and the watchdog see "failed" only on the way out; the state that
    stays (a crash loop) is covered by the test above."""
    app = App(load(shapes(tmp_path)[shape]))
    tree = app.build_tree()
    expected = {
        "sqlite": ["admin", "convergence"],
        "postgres-listen": ["admin", "listen", "convergence"],
        "follower-hint": ["admin", "listen", "convergence"],
        "kube": ["admin", "convergence", "fanout-servicedefinition", "fanout-workflow"],
        "kube-elected": ["admin", "convergence", "fanout"],
    }[shape]
    assert [spec.name for spec in tree.specs] == expected
    assert {spec.name: spec.restart for spec in tree.specs} == {
        name: Restart.PERMANENT for name in expected}
