"""The Kubernetes API server process is stopped and a new one started behind the same address.

The fake API server keeps its state in memory, whereas a real one keeps it in
etcd. So the drill plays etcd by hand: the objects are read from the old
process and written into the new one, and the new one's resourceVersion is moved
past the old one's with compactions, as a restarted kube-apiserver with a fresh
watch cache would present it (old resourceVersions expired: 410 Gone). The
address stays fixed through a TCP proxy in front (a Service VIP or load
balancer), which is stopped for the swap: the daemon sees connections cut, then
refused, then the new server.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import trio

from tests.chaos.support import (
    chaos_config,
    count_lines,
    fake_apiserver_process,
    metric,
    poll_until,
    publish_once,
    revision_body,
    stop_within_grace,
)
from tests.fakes.apiserver import FakeControl, write_kubeconfig
from tests.proc import acli, free_port, run_daemon
from tests.tcpproxy import tcp_proxy

pytestmark = pytest.mark.chaos

GROUP = "platform.trio-supervisor.dev/v1"
CONTROL, APPS = "trio-supervisor", "apps"
PLURALS = ("servicedefinitions", "workflows", "deployments", "services", "cronjobs")


def service_definition(name: str, port: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": f"registry.example/{name}:1"}
    if port is not None:
        spec["port"] = port
    return {"apiVersion": GROUP, "kind": "ServiceDefinition",
            "metadata": {"name": name, "namespace": CONTROL}, "spec": spec}


def workflow(name: str) -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": "Workflow",
            "metadata": {"name": name, "namespace": CONTROL},
            "spec": {"image": "registry.example/batch:1", "schedule": "0 3 * * *"}}


async def children(control: FakeControl) -> dict[str, set[str]]:
    return {plural: {o["metadata"]["name"] for o in await control.objects(plural, APPS)}
            for plural in ("deployments", "services", "cronjobs")}


async def test_apiserver_restart_relists_and_converges(tmp_path: Path, pg_url: str) -> None:
    """Must not be lost: the fan-out's convergence. After the API server comes back,
    the watchers relist (their old resourceVersion is gone) and converge on what
    changed while they were cut off: a parent created meanwhile gets its children,
    the children of a parent deleted meanwhile are swept, untouched parents keep
    theirs. Meanwhile the config snapshot is served and /readyz stays 200: the
    convergence loop does not depend on Kubernetes.
    """
    proxy_port = free_port()
    front = SimpleNamespace(url=f"http://127.0.0.1:{proxy_port}", token=None)
    write_kubeconfig(front, tmp_path / "kubeconfig")
    config, port = chaos_config(
        tmp_path, pg_url,
        extra=f'[kubernetes]\nenabled = true\nkubeconfig = "{tmp_path}/kubeconfig"\n'
              "preflight_retry_s = 1\n")
    base = f"http://127.0.0.1:{port}"
    await acli("db", "migrate", "--config", str(config))
    await trio.to_thread.run_sync(publish_once, pg_url, revision_body(5, "r1"))

    async def fanout_state(http: httpx.AsyncClient) -> dict[str, Any]:
        return dict((await http.get(f"{base}/status")).json()["fanout"])

    with trio.fail_after(120):
        async with fake_apiserver_process(tmp_path / "apiserver-1.log") as old, \
                tcp_proxy(proxy_port, old.port) as proxy, \
                run_daemon(config) as daemon, httpx.AsyncClient(timeout=5) as http:
            control = FakeControl(old.url)
            await daemon.wait_log("ready")
            await daemon.wait_log("fan-out watching", kind="ServiceDefinition")
            await daemon.wait_log("fan-out watching", kind="Workflow")
            for obj in (service_definition("web", 80), service_definition("gone", 81),
                        workflow("nightly")):
                await control.create(obj)
            await poll_until(
                lambda: _has(control, {"deployments": {"web", "gone"},
                                       "services": {"web", "gone"}, "cronjobs": {"nightly"}}),
                "the first fan-out")

            # etcd's view of the cluster, and how far its resourceVersion went.
            saved = {plural: await control.objects(plural) for plural in PLURALS}
            old_rv = int((await control.state())["resourceVersion"])
            proxy.stop()
            await old.stop()
            await daemon.wait_log("watch failed; retrying")
            resp = await http.get(f"{base}/readyz")
            assert resp.status_code == 200

            async with fake_apiserver_process(tmp_path / "apiserver-2.log") as new:
                control = FakeControl(new.url)
                for plural in PLURALS:
                    for obj in saved[plural]:
                        obj = copy.deepcopy(obj)
                        obj["metadata"].pop("resourceVersion", None)  # etcd keeps managedFields
                        await control.put_raw(obj)
                # Changed while the daemon could not watch.
                await control.delete("servicedefinitions", CONTROL, "gone")
                await control.create(service_definition("api", 8080))
                while await control.compact() <= old_rv:
                    pass
                proxy.target_port = new.port
                await proxy.start()

                await poll_until(
                    lambda: _has(control, {"deployments": {"web", "api"},
                                           "services": {"web", "api"},
                                           "cronjobs": {"nightly"}}, exact=True),
                    "convergence after the restart", timeout_s=60)
                state = await poll_until(
                    lambda: _watching(http, base), "both watchers watching again")
                assert state["ServiceDefinition"]["objects"] == 2
                assert state["Workflow"]["objects"] == 1
                api = await control.get("deployments", APPS, "api")
                assert api is not None
                assert api["metadata"]["labels"][
                    "platform.trio-supervisor.dev/servicedefinition"] == "api"
                metrics = (await http.get(f"{base}/metrics")).text
                assert metric(metrics, "supervisor_fanout_watch_restarts_total",
                              kind="ServiceDefinition") > 0
                relisted = (count_lines(daemon, "watch resourceVersion expired; relisting")
                            + count_lines(daemon, "fan-out watch lost; back to preflight"))
                assert relisted > 0, "the watchers never relisted"
                await stop_within_grace(daemon, 5.0)


async def _has(control: FakeControl, want: dict[str, set[str]], exact: bool = False) -> bool:
    have = await children(control)
    if exact:
        return all(have[plural] == names for plural, names in want.items())
    return all(names <= have[plural] for plural, names in want.items())


async def _watching(http: httpx.AsyncClient, base: str) -> dict[str, Any] | None:
    fanout = dict((await http.get(f"{base}/status")).json()["fanout"])
    if all(st["state"] == "watching" for st in fanout.values()):
        return fanout
    return None
