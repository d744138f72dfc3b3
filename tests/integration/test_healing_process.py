"""A supervisor that heals, through the real daemon process and real PostgreSQL.

- A malformed control-plane row is a refusal (``corrupt``), never a crash; once
  repaired, the next publish converges.
- Crash drills: every child is crashed twice by the test-only fault switch
  (``SUPERVISOR_TEST_FAULT_DIR`` + SIGUSR2, a real exception raised inside the
  child's own nursery); after each restart it does its job again, and
  ``/healthz`` answers 503 only while the child is down.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from tests.health import sample_health_blocking, status
from tests.polling import poll_until
from tests.postgres import listener_pids, sql_publish
from tests.proc import EXAMPLE, Daemon, acli, free_port, run_daemon, write_config


async def healthz(port: int) -> tuple[int, dict[str, Any]] | None:
    """(status, body) of /healthz; None when nothing answers (the admin child is down)."""
    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            response = await client.get(f"http://127.0.0.1:{port}/healthz")
    except httpx.TransportError:
        return None
    return response.status_code, response.json()


async def test_null_desired_pointer_is_a_refusal_not_a_crash(tmp_path: Path,
                                                              pg_url: str) -> None:
    port = free_port()
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=0.2, listen=False)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("SET session_replication_role = replica")
                conn.execute("ALTER TABLE supervisor_desired ALTER revision_id DROP NOT NULL")
                conn.execute("UPDATE supervisor_desired SET revision_id = NULL")
            line = await daemon.wait_log(
                "convergence attempt refused by the control plane; previous snapshot "
                "keeps serving", reason="corrupt")
            assert "cannot read" in line["detail"]
            report = await status(port)
            assert report["children"]["convergence"] == {
                "state": "running", "restarts": 0, "last_error": None}
            assert report["revision"]["last_rejection"]["reason"] == "corrupt"
            assert report["revision"]["active"] == 1
            # Repaired, then a new publish: it converges at the next poll.
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("UPDATE supervisor_desired SET revision_id = 1")
                conn.execute("ALTER TABLE supervisor_desired ALTER revision_id SET NOT NULL")
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            await daemon.wait_log("published", revision=2)
            assert not [line for line in daemon.lines if line.get("event") == "child crashed"]


async def crash(daemon: Daemon, fault_dir: Path, child: str) -> None:
    (fault_dir / f"crash-{child}").touch()
    daemon.signal(signal.SIGUSR2)


async def test_every_child_heals_after_two_crashes(tmp_path: Path, pg_url: str) -> None:
    port = free_port()
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    # An hour's poll: only the LISTEN child can make a publish converge quickly.
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=3600, listen=True)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    env = {"SUPERVISOR_TEST_FAULT_DIR": str(fault_dir)}
    with trio.fail_after(120):
        async with run_daemon(config, env=env) as daemon:
            await daemon.wait_log("ready")
            assert await healthz(port) == (200, {"ok": True})
            expected_revision = 1
            for child in ("convergence", "listen", "admin"):
                for round_ in (1, 2):
                    seen: list[tuple[int, dict[str, Any]] | None] = []
                    stop = threading.Event()
                    async with trio.open_nursery() as nursery:
                        try:
                            nursery.start_soon(trio.to_thread.run_sync, sample_health_blocking,
                                               port, seen, stop)
                            # Sampling before the crash (a thread: the loop here is busy).
                            await poll_until(lambda seen=seen: len(seen) >= 2)
                            await crash(daemon, fault_dir, child)
                            await daemon.wait_log("child crashed", child=child)
                            await daemon.wait_log("restarting child", child=child,
                                                  restarts=round_)
                            await poll_until(lambda: listener_pids(pg_url) != [])
                            # The restarted child does its job again.
                            if child == "admin":
                                async def admin_back() -> bool:
                                    return await healthz(port) == (200, {"ok": True})
                                await poll_until(admin_back)
                            rid = await trio.to_thread.run_sync(sql_publish, pg_url)
                            expected_revision = rid
                            await daemon.wait_log("published", revision=rid)
                            # A sample asked before the restart may be answered after
                            # the publish: wait for one healthy answer from after it.
                            after = len(seen)
                            await poll_until(lambda seen=seen, after=after: any(
                                s is not None and s[0] == 200 for s in seen[after:]))
                        finally:  # a failed round must not leave the sampler running
                            stop.set()
                    report = await status(port)
                    assert report["children"][child]["state"] == "running"
                    assert report["children"][child]["restarts"] == round_
                    assert report["revision"]["active"] == expected_revision
                    answered = [s for s in seen if s is not None]
                    # 503 only while the child was down, naming it; 200 again after.
                    unhealthy = [body for code, body in answered if code == 503]
                    assert all(any(child in reason for reason in body["unhealthy"])
                               for body in unhealthy), unhealthy
                    assert answered and answered[-1] == (200, {"ok": True})
                    if child != "admin":
                        assert unhealthy, f"/healthz never said {child} was down: {seen}"
                    # The admin child: nothing answers while it is down, so no 503
                    # can be seen; what matters is that it answers again (above).
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def test_fanout_watchers_heal_after_two_crashes(tmp_path: Path) -> None:
    from tests.fakes.apiserver import run_fake_apiserver, write_kubeconfig
    from tests.fanoutprocess import kube_config, sd

    port = free_port()
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    env = {"SUPERVISOR_TEST_FAULT_DIR": str(fault_dir)}
    with trio.fail_after(120):
        async with run_fake_apiserver(bookmark_interval_s=0.5) as server:
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            # One child per kind without leader election (with it, one "fanout" child).
            config = kube_config(tmp_path, kubeconfig, port, leader_election=False)
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            async with run_daemon(config, env=env) as daemon:
                await daemon.wait_log("ready")
                for round_ in (1, 2):
                    seen: list[tuple[int, dict[str, Any]] | None] = []
                    stop = threading.Event()
                    async with trio.open_nursery() as nursery:
                        try:
                            # In a thread: this test's event loop also runs the fake API
                            # server, and must not slow the sampling down.
                            nursery.start_soon(trio.to_thread.run_sync, sample_health_blocking,
                                               port, seen, stop)
                            await poll_until(lambda seen=seen: len(seen) >= 2)
                            await crash(daemon, fault_dir, "fanout-servicedefinition")
                            await daemon.wait_log("child crashed", child="fanout-servicedefinition")
                            await daemon.wait_log("restarting child",
                                                  child="fanout-servicedefinition", restarts=round_)
                            # The restarted watcher fans out a parent created after the crash.
                            name = f"after-crash-{round_}"
                            server.create(sd(name))
                            await server.wait_until(
                                lambda name=name: server.get("deployments", "apps", name) is not None)
                            # The watcher runs again; a probe sent while it was down may
                            # still be answered after this point (CI saw it as the last
                            # sample), so wait for one sent since.
                            after = len(seen)
                            await poll_until(lambda seen=seen, after=after: any(
                                s is not None and s[0] == 200 for s in seen[after:]))
                        finally:  # a failed round must not leave the sampler running
                            stop.set()
                    report = await status(port)
                    child = report["children"]["fanout-servicedefinition"]
                    assert child["state"] == "running" and child["restarts"] == round_
                    answered = [s for s in seen if s is not None]
                    unhealthy = [body for code, body in answered if code == 503]
                    assert unhealthy, f"/healthz never said the watcher was down: {seen}"
                    assert all(any("fanout-servicedefinition" in r for r in body["unhealthy"])
                               for body in unhealthy)
                    assert answered[-1] == (200, {"ok": True})
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0
