"""The fan-out engine against the fake API server, over real HTTP on loopback: the harness.

:func:`harness` runs a :class:`~supervisor.fanout.engine.FanoutEngine` with a
:class:`~supervisor.kube.client.KubeClient` configured from a kubeconfig that
points at the fake (never a patched client); tests observe the fake's state
and its request log. Timings are shrunk (bookmarks every 0.2 s, inactivity
deadline 1 s, requeues 0.05 to 0.2 s); the periodic resync is an hour, tests
call ``resync()`` themselves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from supervisor.config import KubernetesConfig
from supervisor.fanout.engine import FanoutEngine, FanoutKind, FanoutTuning
from supervisor.fanout.labels import INSTALLATION_KEY, LINEAGE_SERVICEDEFINITION
from supervisor.fanout.servicedefinition import SERVICE_DEFINITION
from supervisor.fanout.status import FanoutStatus
from supervisor.kube.applying import ChildKey
from supervisor.kube.client import KubeClient
from supervisor.kube.watching import WatchTuning
from supervisor.telemetry import Metrics
from tests.fakes.apiserver import FakeApiServer, run_fake_apiserver, write_kubeconfig

GROUP = "platform.trio-supervisor.dev/v1"
CONTROL = "trio-supervisor"
APPS = "apps"

FAST = FanoutTuning(
    watch=WatchTuning(timeout_s=30, inactivity_s=1.0, backoff_initial_s=0.05,
                      backoff_max_s=0.2, page_size=50),
    workers=4,
    resync_s=3600.0,  # tests call resync() themselves
    requeue_initial_s=0.05,
    requeue_max_s=0.2,
)


@dataclass
class Harness:
    fake: FakeApiServer
    reconciler: FanoutEngine[Any]
    status: FanoutStatus
    metrics: Metrics
    client: KubeClient

    def metric(self, name: str, **labels: str) -> float:
        registry = self.metrics.registry
        value = registry.get_sample_value(f"supervisor_{name}_total", labels)
        if value is None:
            value = registry.get_sample_value(f"supervisor_{name}", labels)
        return 0.0 if value is None else value

    async def until(self, predicate: Any) -> None:
        await self.fake.wait_until(predicate)

    async def idle(self) -> None:
        """Wait until the work queue is drained (nothing queued, running or requeued)."""
        await self.reconciler.queue.wait_idle()


@asynccontextmanager
async def harness(
    tmp_path: Path,
    *,
    kind: FanoutKind[Any] = SERVICE_DEFINITION,
    tuning: FanoutTuning = FAST,
    preflight_retry_s: float = 0.2,
    before_start: Any = None,
    token_file: Path | None = None,
    settings: dict[str, Any] | None = None,
    client_timeout_s: float = 10.0,
    **fake_kwargs: Any,
) -> AsyncIterator[Harness]:
    """The engine of ``kind`` on a fresh fake; ``settings``: more ``[kubernetes]`` keys;
    ``client_timeout_s``: the client's request timeout (a response's headers within it)."""
    fake_kwargs.setdefault("bookmark_interval_s", 0.2)
    async with run_fake_apiserver(**fake_kwargs) as fake:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(fake, kubeconfig, token_file=str(token_file) if token_file else None)
        if before_start is not None:
            before_start(fake)
        client = KubeClient.from_kubeconfig(str(kubeconfig), timeout_s=client_timeout_s)
        status = FanoutStatus()
        metrics = Metrics(process=False)
        config = KubernetesConfig(enabled=True, kubeconfig=str(kubeconfig),
                                  preflight_retry_s=preflight_retry_s, **(settings or {}))
        reconciler = FanoutEngine(client, kind, config, metrics, status, tuning)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(reconciler.run)
                yield Harness(fake, reconciler, status, metrics, client)
                nursery.cancel_scope.cancel()
        finally:
            with trio.move_on_after(2, shield=True):
                await client.aclose()


def sd(name: str, *, image: str = "nginx:1.27", port: int | None = None,
       env: dict[str, str] | None = None, replicas: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": image}
    if port is not None:
        spec["port"] = port
    if env is not None:
        spec["env"] = env
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": GROUP, "kind": "ServiceDefinition",
            "metadata": {"name": name, "namespace": CONTROL}, "spec": spec}


def wf(name: str, *, image: str = "busybox", schedule: str = "*/5 * * * *",
       args: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": image, "schedule": schedule}
    if args is not None:
        spec["args"] = args
    return {"apiVersion": GROUP, "kind": "Workflow",
            "metadata": {"name": name, "namespace": CONTROL}, "spec": spec}


def container(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def ready(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == "Ready":
            return cond  # type: ignore[no-any-return]
    return None


def events(fake: FakeApiServer, reason: str, name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in fake.objects("events", CONTROL)
            if e["reason"] == reason and (name is None or e["involvedObject"]["name"] == name)]


def child_writes(fake: FakeApiServer) -> list[Any]:
    return [r for r in fake.writes() if f"/namespaces/{APPS}/" in r.path]


def _ours(name: str, parent: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": parent, "app.kubernetes.io/managed-by": "trio-supervisor",
              INSTALLATION_KEY: CONTROL, LINEAGE_SERVICEDEFINITION: parent}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": APPS, "labels": labels},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }


def web_replicas(fake: FakeApiServer) -> int:
    return int((fake.get("deployments", APPS, "web") or {})["spec"]["replicas"])


async def replicas_fighter(h: Harness) -> None:
    """Another controller: wants 5 replicas of web, and says so at once after each repair."""
    while True:
        await h.until(lambda: web_replicas(h.fake) == 1)
        h.fake.patch("deployments", APPS, "web", {"spec": {"replicas": 5}},
                     field_manager="other-controller")


DEPLOYMENT = ChildKey("deployments", "web")


def fights(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if "keeps drifting" in str(e.get("event"))]


def recent_repairs(h: Harness) -> int:
    """Repairs of the Deployment the limiter holds within its window."""
    return h.reconciler.writer.repairs.recent(DEPLOYMENT, trio.current_time())


async def web_ready(h: Harness) -> None:
    h.fake.create(sd("web"))
    await h.until(lambda: ready(h.fake.get("servicedefinitions", CONTROL, "web")))
    await h.idle()

