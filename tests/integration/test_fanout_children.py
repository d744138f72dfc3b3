"""``fanout_children``: the app wiring's entry point, run under the supervision tree."""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio

from supervisor import reasons
from supervisor.config import KubernetesConfig
from supervisor.fanout.children import fanout_children, run_fanout_group
from supervisor.fanout.engine import FanoutTuning
from supervisor.fanout.status import FanoutStatus
from supervisor.kube.client import KubeClient
from supervisor.kube.watching import WatchTuning
from supervisor.telemetry import Metrics
from supervisor.tree import Supervisor
from tests.fakes.apiserver import run_fake_apiserver, write_kubeconfig

FAST = FanoutTuning(watch=WatchTuning(timeout_s=30, inactivity_s=1.0, backoff_initial_s=0.05,
                                      backoff_max_s=0.2), requeue_initial_s=0.05,
                    requeue_max_s=0.2)
GROUP = "platform.trio-supervisor.dev/v1"


def test_one_child_per_kind_and_a_status_each() -> None:
    statuses: dict[str, FanoutStatus] = {}
    specs = fanout_children(KubernetesConfig(enabled=True), Metrics(process=False), statuses)
    assert [spec.name for spec in specs] == ["fanout-servicedefinition", "fanout-workflow"]
    assert list(statuses) == list(reasons.FANOUT_KINDS)
    assert all(msgspec.to_builtins(st.report()) == {"state": "preflight",
                                                    "last_error_class": None, "objects": 0}
               for st in statuses.values())


async def test_children_share_one_client_fan_out_and_close_it_on_shutdown(
    tmp_path: Path,
) -> None:
    clients: list[KubeClient] = []
    with trio.fail_after(15):
        async with run_fake_apiserver(bookmark_interval_s=0.2) as fake:
            write_kubeconfig(fake, tmp_path / "kubeconfig")
            config = KubernetesConfig(enabled=True, kubeconfig=str(tmp_path / "kubeconfig"),
                                      preflight_retry_s=0.2)

            def factory() -> KubeClient:
                clients.append(KubeClient.from_kubeconfig(config.kubeconfig))
                return clients[-1]

            statuses: dict[str, FanoutStatus] = {}
            tree = Supervisor(
                fanout_children(config, Metrics(process=False), statuses, tuning=FAST,
                                client_factory=factory),
                intensity=3, period_s=60,
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(tree.run)
                await fake.wait_until(lambda: all(st.state == "watching"
                                                  for st in statuses.values()))
                fake.create({"apiVersion": GROUP, "kind": "ServiceDefinition",
                             "metadata": {"name": "web", "namespace": "trio-supervisor"},
                             "spec": {"image": "nginx", "port": 80}})
                fake.create({"apiVersion": GROUP, "kind": "Workflow",
                             "metadata": {"name": "job", "namespace": "trio-supervisor"},
                             "spec": {"image": "busybox", "schedule": "@daily"}})
                await fake.wait_until(lambda: fake.get("services", "apps", "web") is not None
                                      and fake.get("cronjobs", "apps", "job") is not None)
                assert statuses["ServiceDefinition"].objects == 1
                assert statuses["Workflow"].objects == 1
                await tree.shutdown()
                nursery.cancel_scope.cancel()
    assert len(clients) == 1, "both kinds share one client"
    assert clients[0]._closed and clients[0]._http is None


async def test_children_start_at_once_while_kubernetes_is_unavailable(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver() as fake:
            # Every request fails: the API server is there but unavailable.
            fake.inject("*", ".*", status=503, times=None)
            write_kubeconfig(fake, tmp_path / "kubeconfig")
            config = KubernetesConfig(enabled=True, kubeconfig=str(tmp_path / "kubeconfig"),
                                      preflight_retry_s=300)
            statuses: dict[str, FanoutStatus] = {}
            tree = Supervisor(fanout_children(config, Metrics(process=False), statuses,
                                              tuning=FAST), intensity=3, period_s=60)
            async with trio.open_nursery() as nursery:
                start = trio.current_time()
                await nursery.start(tree.run)  # what READY=1 waits for
                assert trio.current_time() - start < 1.0
                assert {c.state for c in tree.children.values()} == {"running"}
                await fake.wait_until(lambda: fake.count(status=503) >= 2)
                await fake.wait_until(lambda: all(st.last_error_class is not None
                                                  for st in statuses.values()))
                assert {st.state for st in statuses.values()} == {"preflight"}
                assert {st.last_error_class for st in statuses.values()} == {
                    reasons.NAMESPACE_OR_RBAC_UNREADY}
                # Shutdown is prompt although each watcher sleeps 300 s in its preflight.
                shutdown_start = trio.current_time()
                await tree.shutdown()
                assert trio.current_time() - shutdown_start < 3.0
                nursery.cancel_scope.cancel()


async def test_the_fan_out_runs_and_stops_as_one_group(tmp_path: Path) -> None:
    # Room for leader election: every kind starts together, on one client, and
    # one cancellation stops them all (after the bounded drain); a second run starts fresh.
    clients: list[KubeClient] = []
    with trio.fail_after(15):
        async with run_fake_apiserver(bookmark_interval_s=0.2) as fake:
            write_kubeconfig(fake, tmp_path / "kubeconfig")
            config = KubernetesConfig(enabled=True, kubeconfig=str(tmp_path / "kubeconfig"),
                                      preflight_retry_s=0.2)

            def factory() -> KubeClient:
                clients.append(KubeClient.from_kubeconfig(config.kubeconfig))
                return clients[-1]

            statuses: dict[str, FanoutStatus] = {}
            for run in range(2):
                name = f"web-{run}"
                with trio.CancelScope() as group:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(lambda task_status: run_fanout_group(
                            config, Metrics(process=False), statuses, tuning=FAST,
                            client_factory=factory, task_status=task_status))
                        await fake.wait_until(lambda: len(statuses) == 2 and all(
                            st.state == "watching" for st in statuses.values()))
                        fake.create({"apiVersion": GROUP, "kind": "ServiceDefinition",
                                     "metadata": {"name": name,
                                                  "namespace": "trio-supervisor"},
                                     "spec": {"image": "nginx"}})
                        await fake.wait_until(
                            lambda: fake.get("deployments", "apps", name) is not None)  # noqa: B023
                        group.cancel()
                assert clients[-1]._closed
    assert len(clients) == 2


async def test_the_daemon_s_client_paces_requests_at_the_configured_qps_and_burst(
    tmp_path: Path,
) -> None:
    # [kubernetes] qps/burst reach the client the daemon builds, and every
    # request takes a token: the burst goes at once, the next one waits for the rate.
    from supervisor.fanout.children import _factory
    from supervisor.kube.models import Resource

    namespaces = Resource("", "v1", "namespaces", "Namespace")
    with trio.fail_after(15):
        async with run_fake_apiserver() as fake:
            write_kubeconfig(fake, tmp_path / "kubeconfig")
            config = KubernetesConfig(enabled=True, kubeconfig=str(tmp_path / "kubeconfig"),
                                      qps=0.001, burst=3)
            client = _factory(config)()
            try:
                assert client.limiter is not None
                assert (client.limiter.qps, client.limiter.burst) == (0.001, 3)
                for _ in range(3):
                    assert await client.serves(namespaces)
                assert client.limiter.waited_s == 0.0
                before = len(fake.requests)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(client.serves, namespaces)
                    await fake.wait_until(lambda: client.limiter is not None
                                          and client.limiter.waited_s > 900)
                    nursery.cancel_scope.cancel()
                assert len(fake.requests) == before  # the fourth never went out
            finally:
                await client.aclose()
