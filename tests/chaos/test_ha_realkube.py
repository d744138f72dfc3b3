"""Two replicas on a real kube-apiserver: kill -9 of the leader in the middle of a bulk fan-out.

The daemons run on the ServiceAccount token of ``manifests/`` (so the Lease RBAC is
the shipped one). Each replica applies with its own field manager, so the
children's ``managedFields`` say who wrote them: before the kill only the
leader's appears; after it the standby finishes the bulk, every parent Ready,
and no child that existed at the kill was deleted (same uid), so no orphan
sweep went wrong.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.ha import Timings, log_time
from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config
from tests.realkube import Installation, RealKube, start_realkube
from tests.tcpproxy import tcp_proxy

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

GROUP = "platform.trio-supervisor.dev/v1"
PARENTS = 500
# The real server on two shared cores answers slowly under a bulk: roomier timings.
T = Timings(lease_duration_s=8.0, renew_deadline_s=6.0, retry_period_s=1.0)


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    with start_realkube(tmp_path_factory.mktemp("kube")) as server:
        server.install_crds()
        yield server


def config_for(tmp_path: Path, inst: Installation, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    extra = inst.toml(identity=f"replica-{name}", field_manager=f"mgr-{name}",
                      lease_duration_s=T.lease_duration_s,
                      renew_deadline_s=T.renew_deadline_s, retry_period_s=T.retry_period_s)
    return write_config(directory, f"sqlite:///{tmp_path}/cp.db", extra, port=free_port())


def deployments(kube: RealKube, inst: Installation) -> list[dict[str, Any]]:
    found = kube.get(f"/apis/apps/v1/namespaces/{inst.apps}/deployments") or {}
    return list(found.get("items", []))


def managers(obj: dict[str, Any]) -> set[str]:
    return {entry["manager"] for entry in obj["metadata"].get("managedFields") or []}


def ready_parents(kube: RealKube, inst: Installation) -> int:
    found = kube.get(f"/apis/{GROUP}/namespaces/{inst.control}/servicedefinitions") or {}
    return sum(1 for item in found.get("items", []) if any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (item.get("status") or {}).get("conditions") or []))


async def test_kill_9_of_the_leader_mid_bulk_on_a_real_api_server(
        kube: RealKube, tmp_path: Path) -> None:
    inst = await trio.to_thread.run_sync(kube.install)
    a, b = config_for(tmp_path, inst, "a"), config_for(tmp_path, inst, "b")
    await acli("publish", "--config", str(a), str(EXAMPLE), "--force")
    with trio.fail_after(600):
        async with run_daemon(a) as da:
            await da.wait_log("fan-out leadership acquired")
            async with run_daemon(b) as db:
                await db.wait_log("fan-out leader observed", holder="replica-a")

                def create_all() -> None:
                    for i in range(PARENTS):
                        kube.apply({"apiVersion": GROUP, "kind": "ServiceDefinition",
                                    "metadata": {"name": f"bulk-{i:03d}",
                                                 "namespace": inst.control},
                                    "spec": {"image": "nginx:1.27", "replicas": 1}})

                # The kill lands while the parents are still being created: the leader
                # cannot have written the children of parents that do not exist yet.
                async with trio.open_nursery() as bulk:
                    bulk.start_soon(partial(trio.to_thread.run_sync, create_all))
                    await poll_until(lambda: trio.to_thread.run_sync(
                        lambda: len(deployments(kube, inst)) >= PARENTS // 5))
                    da.signal(9)
                    killed = time.time()
                    await da.wait()
                    before = {d["metadata"]["name"]: d for d in
                              await trio.to_thread.run_sync(deployments, kube, inst)}
                assert len(before) < PARENTS, "the bulk finished before the kill"
                assert all(managers(d) & {"mgr-a", "mgr-b"} == {"mgr-a"}
                           for d in before.values()), "the standby wrote while standing by"
                took = await db.wait_log("fan-out leadership acquired")
                handover = log_time(took) - killed
                assert handover <= T.lease_duration_s + T.retry_period_s + 3.0, handover
                await poll_until(lambda: trio.to_thread.run_sync(
                    lambda: ready_parents(kube, inst) == PARENTS))
                after = {d["metadata"]["name"]: d for d in
                         await trio.to_thread.run_sync(deployments, kube, inst)}
                assert len(after) == PARENTS
                for name, old in before.items():
                    assert after[name]["metadata"]["uid"] == old["metadata"]["uid"], name
                lease = await trio.to_thread.run_sync(
                    kube.get, f"/apis/coordination.k8s.io/v1/namespaces/{inst.control}"
                              "/leases/trio-supervisor-fanout")
                assert lease is not None and lease["spec"]["holderIdentity"] == "replica-b"
                assert lease["spec"]["leaseTransitions"] >= 1


async def test_api_server_unreachable_past_the_renew_deadline_on_a_real_api_server(
        kube: RealKube, tmp_path: Path) -> None:
    """Behind a proxy (the Service address): cut for longer than the lease, then back."""
    inst = await trio.to_thread.run_sync(kube.install)
    target = int(kube.url.rsplit(":", 1)[1])
    port = free_port()
    text = inst.kubeconfig.read_text().replace(kube.url, f"https://127.0.0.1:{port}")
    proxied = tmp_path / "kubeconfig-proxied"
    proxied.write_text(text)
    inst = Installation(inst.control, inst.apps, proxied)
    a, b = config_for(tmp_path, inst, "a"), config_for(tmp_path, inst, "b")
    await acli("publish", "--config", str(a), str(EXAMPLE), "--force")
    with trio.fail_after(300):
        async with tcp_proxy(port, target) as proxy, run_daemon(a) as da:
            await da.wait_log("fan-out leadership acquired")
            async with run_daemon(b) as db:
                await db.wait_log("fan-out leader observed", holder="replica-a")
                for i in range(20):
                    await trio.to_thread.run_sync(kube.apply, {
                        "apiVersion": GROUP, "kind": "ServiceDefinition",
                        "metadata": {"name": f"web-{i}", "namespace": inst.control},
                        "spec": {"image": "nginx:1.27", "replicas": 1}})
                await poll_until(lambda: trio.to_thread.run_sync(
                    lambda: ready_parents(kube, inst) == 20))
                proxy.stop()
                cut = time.time()
                lost = await da.wait_log("fan-out leadership lost; fan-out stopped")
                assert log_time(lost) - cut <= T.renew_deadline_s + 1.0
                await trio.sleep(T.lease_duration_s)  # the outage outlasts the lease
                # Changed while nobody could see it: a new parent.
                await trio.to_thread.run_sync(kube.apply, {
                    "apiVersion": GROUP, "kind": "ServiceDefinition",
                    "metadata": {"name": "during", "namespace": inst.control},
                    "spec": {"image": "nginx:1.27", "replicas": 1}})
                await proxy.start()
                await poll_until(lambda: trio.to_thread.run_sync(
                    lambda: ready_parents(kube, inst) == 21))
                lease_path = (f"/apis/coordination.k8s.io/v1/namespaces/{inst.control}"
                              "/leases/trio-supervisor-fanout")
                lease = await trio.to_thread.run_sync(kube.get, lease_path)
                assert lease is not None
                holder = lease["spec"]["holderIdentity"]
                assert holder in ("replica-a", "replica-b")
                # Exactly one leads, the holder, and stays so over a few renewals.
                for _ in range(4):
                    leading = [d for d in (da, db) if _role(d) == "leader"]
                    assert len(leading) == 1
                    await trio.sleep(T.retry_period_s)
                during = await trio.to_thread.run_sync(
                    kube.get, f"/apis/apps/v1/namespaces/{inst.apps}/deployments/during")
                assert during is not None
                assert managers(during) & {"mgr-a", "mgr-b"} == {f"mgr-{holder[-1]}"}


def _role(daemon: Any) -> str:
    """The role the daemon's log says it holds now (its last transition line)."""
    role = "standby"
    for line in daemon.lines:
        if line.get("event") == "fan-out leadership acquired":
            role = "leader"
        elif line.get("event") == "fan-out leadership lost; fan-out stopped":
            role = "standby"
    return role
