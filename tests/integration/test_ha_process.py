"""Two real daemon replicas on the fake API server: one fans out, handover is safe and fast.

Timings are short (lease 5 s, renew deadline 3 s, retry 0.5 s); the bounds
checked are the protocol's (a handover after a clean stop needs no lease
expiry; after a kill it needs one), never a latency budget.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.fakes.apiserver import FakeApiServer, run_fake_apiserver, write_kubeconfig
from tests.fakes.leases import lease_holder, refuse_lease_writes
from tests.ha import (
    APPS,
    CONTROL,
    LEASE_NAME,
    Replica,
    Timings,
    acquired,
    all_ready,
    child_writes,
    first_leader,
    lease_writes,
    log_time,
    replica,
    sd,
)
from tests.proc import EXAMPLE, Daemon, acli, run_daemon

T = Timings()


async def published_pair(tmp_path: Path, server: FakeApiServer) -> tuple[Replica, Replica]:
    """Replicas a and b of one SQLite control plane on ``server``, with EXAMPLE published."""
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(server, kubeconfig)
    cp = f"sqlite:///{tmp_path}/cp.db"
    a, b = replica(tmp_path, "a", kubeconfig, cp), replica(tmp_path, "b", kubeconfig, cp)
    await acli("publish", "--config", str(a.config), str(EXAMPLE), "--force")
    return a, b


@asynccontextmanager
async def a_leads_b_stands_by(a: Replica, b: Replica) -> AsyncIterator[tuple[Daemon, Daemon]]:
    """a's daemon, once it has acquired the lease; then b's, once it has seen a lead."""
    async with run_daemon(a.config) as da:
        await da.wait_log("fan-out leadership acquired")
        async with run_daemon(b.config) as db:
            await db.wait_log("fan-out leader observed", holder=a.identity)
            yield da, db


async def test_two_replicas_one_fans_out_and_sigterm_hands_over(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with run_fake_apiserver(bookmark_interval_s=0.5) as server:
            a, b = await published_pair(tmp_path, server)
            names = [f"web-{i}" for i in range(20)]
            for name in names:
                server.create(sd(name))
            async with run_daemon(a.config) as da, run_daemon(b.config) as db:
                await da.wait_log("ready")
                await db.wait_log("ready")
                daemons = {"a": da, "b": db}
                lead_name = await first_leader(daemons)
                leader, standby = (a, b) if lead_name == "a" else (b, a)
                d_leader, d_standby = daemons[leader.name], daemons[standby.name]
                await server.wait_until(lambda: all_ready(server, names))
                await d_standby.wait_log("fan-out leader observed", holder=leader.identity)
                # Both serve and are ready; only the leader wrote anything.
                for r in (leader, standby):
                    assert (await r.get("/readyz")).status_code == 200
                report = (await standby.status())["leadership"]
                assert report == {"role": "standby", "holder": leader.identity,
                                  "lease": f"{CONTROL}/{LEASE_NAME}"}
                assert (await leader.status())["leadership"]["role"] == "leader"
                metrics = (await standby.get("/metrics")).text
                assert "supervisor_leader 0.0" in metrics
                assert "supervisor_leader 1.0" in (await leader.get("/metrics")).text
                # Renewals go on for a few retry periods; the standby still writes nothing.
                renewals = len(lease_writes(server, leader.identity))
                await server.wait_until(
                    lambda: len(lease_writes(server, leader.identity)) >= renewals + 4)
                assert child_writes(server, leader.manager)
                assert child_writes(server, standby.manager) == []
                assert lease_holder(server, CONTROL, LEASE_NAME) == leader.identity

                d_leader.signal(signal.SIGTERM)
                assert await d_leader.wait() == 0
                released = await d_leader.wait_log("fan-out lease released")
                took = await d_standby.wait_log("fan-out leadership acquired")
                handover = log_time(took) - log_time(released)
                # Released, not expired: well within a lease duration.
                assert handover < T.lease_duration_s, handover
                server.create(sd("after-handover"))
                await server.wait_until(lambda: all_ready(server, ["after-handover"]))
                assert (await standby.status())["leadership"]["role"] == "leader"
                assert not [r for r in child_writes(server, standby.manager)
                            if r.method == "DELETE"]


@pytest.mark.slow
@pytest.mark.chaos  # 18 s: a drill, run by CI's `pytest -m chaos`
async def test_kill_9_of_the_leader_mid_bulk(tmp_path: Path) -> None:
    with trio.fail_after(180):
        async with run_fake_apiserver(bookmark_interval_s=0.5) as server:
            a, b = await published_pair(tmp_path, server)
            async with a_leads_b_stands_by(a, b) as (da, db):
                names = [f"bulk-{i}" for i in range(500)]
                for name in names:
                    server.create(sd(name))
                await server.wait_until(
                    lambda: len([r for r in child_writes(server, a.manager)
                                 if "/deployments/" in r.target]) >= 20)
                da.signal(signal.SIGKILL)
                killed = time.time()
                await da.wait()
                took = await db.wait_log("fan-out leadership acquired")
                handover = log_time(took) - killed
                # A lease duration (from b's last observation) plus one retry period,
                # and some slack for two processes on a busy machine.
                assert handover <= T.lease_duration_s + T.retry_period_s + 2.0, handover
                await server.wait_until(lambda: all_ready(server, names))
                assert not [r for r in server.requests
                            if r.method == "DELETE" and f"/namespaces/{APPS}/" in r.path]
                assert len(server.objects("deployments", APPS)) == len(names)


async def test_refused_renewals_stop_the_leader_before_the_lease_expires(
        tmp_path: Path) -> None:
    """The split: the leader can read but its Lease writes are refused."""
    with trio.fail_after(120):
        async with run_fake_apiserver(bookmark_interval_s=0.5) as server:
            a, b = await published_pair(tmp_path, server)
            async with a_leads_b_stands_by(a, b) as (da, db):
                async with trio.open_nursery() as nursery:

                    async def keep_creating() -> None:
                        # New parents all along: the leader writes as long as it leads.
                        for i in range(10_000):
                            server.create(sd(f"p-{i}"))
                            await trio.sleep(0.05)

                    nursery.start_soon(keep_creating)
                    await server.wait_until(lambda: len(child_writes(server, a.manager)) >= 5)
                    refuse_lease_writes(server, a.identity)
                    lost = await da.wait_log("fan-out leadership lost; fan-out stopped")
                    await db.wait_log("fan-out leadership acquired")
                    nursery.cancel_scope.cancel()
                    last_renewal = max(r.time for r in lease_writes(server, a.identity))
                    a_writes = child_writes(server, a.manager)
                    b_lease = lease_writes(server, b.identity)
                    assert b_lease, "b never wrote the lease"
                    # a's last fan-out write came before its lease could expire for b,
                    # and before b took over.
                    assert max(r.time for r in a_writes) < last_renewal + T.lease_duration_s
                    assert max(r.time for r in a_writes) < min(r.time for r in b_lease)
                    assert "renew_deadline_s" in lost["why"]
                    status = await a.status()
                    assert status["leadership"]["role"] == "standby"
                    assert (await a.get("/readyz")).status_code == 200


async def test_leader_election_off_fans_out_alone(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with run_fake_apiserver(bookmark_interval_s=0.5) as server:
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            a = replica(tmp_path, "a", kubeconfig, f"sqlite:///{tmp_path}/cp.db")
            a.config.write_text(a.config.read_text() + "leader_election = false\n")
            await acli("publish", "--config", str(a.config), str(EXAMPLE), "--force")
            server.create(sd("solo"))
            async with run_daemon(a.config) as da:
                await da.wait_log("ready")
                await server.wait_until(lambda: all_ready(server, ["solo"]))
                assert (await a.status())["leadership"] == {
                    "role": "disabled", "holder": None, "lease": None}
                assert not acquired(da)
                assert server.count(path_contains="/leases") == 0
                da.signal(signal.SIGTERM)
                assert await da.wait() == 0
