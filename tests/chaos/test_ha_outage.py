"""Two replicas; the API server becomes unreachable for longer than the renew deadline.

The fake API server sits behind a TCP proxy (its Service address); stopping the
proxy cuts every connection and refuses new ones. The leader must stop its
fan-out within the renew deadline (it cannot know whether its Lease still
stands), and once the server is back exactly one replica leads and the fan-out
resumes from a fresh list.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from tests.fakes.apiserver import run_fake_apiserver, write_kubeconfig
from tests.ha import Timings, all_ready, child_writes, first_leader, log_time, replica, sd
from tests.proc import EXAMPLE, acli, free_port, run_daemon
from tests.tcpproxy import tcp_proxy

pytestmark = pytest.mark.chaos

T = Timings()


async def test_api_server_gone_past_the_renew_deadline(tmp_path: Path) -> None:
    with trio.fail_after(150):
        async with run_fake_apiserver(bookmark_interval_s=0.5) as server:
            port = free_port()
            target = int(server.url.rsplit(":", 1)[1])
            async with tcp_proxy(port, target) as proxy:
                kubeconfig = tmp_path / "kubeconfig"
                write_kubeconfig(SimpleNamespace(url=f"http://127.0.0.1:{port}", token=None),
                                 kubeconfig)
                cp = f"sqlite:///{tmp_path}/cp.db"
                a = replica(tmp_path, "a", kubeconfig, cp)
                b = replica(tmp_path, "b", kubeconfig, cp)
                await acli("publish", "--config", str(a.config), str(EXAMPLE))
                names = [f"web-{i}" for i in range(10)]
                for name in names:
                    server.create(sd(name))
                async with run_daemon(a.config) as da, run_daemon(b.config) as db:
                    daemons = {"a": da, "b": db}
                    first = await first_leader(daemons)
                    leader = daemons[first]
                    await server.wait_until(lambda: all_ready(server, names))

                    proxy.stop()
                    cut = time.time()
                    lost = await leader.wait_log("fan-out leadership lost; fan-out stopped")
                    # At the renew deadline counted from the last renewal's start, which
                    # came at most a retry period before the cut: never later.
                    after = log_time(lost) - cut
                    assert after <= T.renew_deadline_s + 0.5, after
                    assert after >= T.renew_deadline_s - T.retry_period_s - 0.5, after
                    # Both replicas keep serving meanwhile.
                    for r in (a, b):
                        assert (await r.get("/readyz")).status_code == 200
                        assert (await r.status())["leadership"]["role"] == "standby"
                    during = len(server.requests)
                    await trio.sleep(T.lease_duration_s)  # the outage outlasts the lease
                    assert len(server.requests) == during  # nothing got through, by design

                    await proxy.start()
                    server.create(sd("after-outage"))
                    await server.wait_until(lambda: all_ready(server, [*names, "after-outage"]))
                    # Exactly one leads, and it stays that way over several renewals.
                    for _ in range(6):
                        roles = [(await r.status())["leadership"]["role"] for r in (a, b)]
                        assert sorted(roles) in (["leader", "standby"], ["standby", "standby"])
                        await trio.sleep(T.retry_period_s)
                    roles = [(await r.status())["leadership"]["role"] for r in (a, b)]
                    assert sorted(roles) == ["leader", "standby"]
                    writers = [r.name for r in (a, b) if any(
                        w.target.endswith("/after-outage") for w in child_writes(server, r.manager))]
                    assert len(writers) == 1
                    for daemon in (da, db):
                        daemon.signal(signal.SIGTERM)
                        assert await daemon.wait() == 0
