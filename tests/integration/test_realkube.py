"""The real daemon process against a real kube-apiserver (v1.20.2, ../shared/realkube).

The daemon runs on a ServiceAccount token from the TokenRequest API, bound by
the project's own ``manifests/`` (tests/realkube.py renames their namespaces
and nothing else), so an RBAC rule missing from the manifests fails here.
Skipped with the reason when ``SUPERVISOR_TEST_KUBE_ASSETS`` is unset.

The first test runs before the CRDs are installed (tests run in file order;
the ``crds`` fixture installs them for the rest). What v1.20 lacks: batch/v1
CronJob (so the Workflow kind reports ``child_api_missing`` throughout), CEL
rules, and controllers (a Deployment's status is written here by hand).

Covered here: the preflight with the CRDs absent and then present (woken by
SIGHUP), ``child_api_missing``, create/update/delete, drift repair of a deleted
and an edited child, Events and the Ready/Available conditions, no writes when
nothing drifted, the orphan sweep at restart, the sweep guard, a 410 relist
after an API server restart, SIGTERM (every daemon here exits 0 on it), and the
election's Lease writes keeping the object as read (labels) and the server's 422
for a Lease PUT without a resourceVersion (which the fake reproduces).
Faults a real server cannot be made to produce on demand (409, 429, hangs,
compaction) are tested against the fake (test_fanout_controller.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

from supervisor import reasons
from tests.health import metric, status
from tests.polling import poll_until
from tests.proc import free_port, run_daemon
from tests.realkube import (
    Installation,
    RealKube,
    aget,
    aget_ready,
    condition,
    daemon_config,
    deployment_path,
    gone,
    parent_path,
    sd,
    start_realkube,
)


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    with start_realkube(tmp_path_factory.mktemp("kube")) as server:
        yield server


@pytest.fixture
def crds(kube: RealKube) -> RealKube:
    if not kube.crds_installed:
        kube.install_crds()
    return kube


async def events(kube: RealKube, inst: Installation, reason: str) -> list[dict[str, Any]]:
    found = await aget(kube, f"/api/v1/namespaces/{inst.control}/events") or {}
    return [e for e in found.get("items", []) if e["reason"] == reason]


async def test_preflight_without_crds_then_sighup_once_they_are_applied(
    kube: RealKube, tmp_path: Path,
) -> None:
    assert not kube.crds_installed, "this test must run before the CRDs are installed"
    inst = await trio.to_thread.run_sync(kube.install)
    port = free_port()
    config = await daemon_config(tmp_path, inst, port, preflight_retry_s=300)
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            # The CRD is missing: a warning naming the fix, the kind dormant.
            line = await daemon.wait_log(None, kind="ServiceDefinition",
                                         error_class=reasons.NAMESPACE_OR_RBAC_UNREADY)
            assert line["level"] == "warning"
            # Retries grow from ~1 s: wait for the fourth, after which the next is ~8 s away.
            await poll_until(lambda: sum(
                1 for e in daemon.lines if e.get("kind") == "ServiceDefinition"
                and e.get("error_class")) >= 4)
            await trio.to_thread.run_sync(kube.install_crds)
            daemon.signal(signal.SIGHUP)
            woken = trio.current_time()
            await daemon.wait_log("fan-out watching", kind="ServiceDefinition")
            assert trio.current_time() - woken < 3.0
            # With its CRD present, the Workflow kind meets its child: batch/v1 CronJob is
            # not served by 1.20. Its own class and fix, at error, not the apps-namespace hint.
            missing = await daemon.wait_log(None, kind="Workflow",
                                            error_class=reasons.CHILD_API_MISSING)
            assert missing["level"] == "error"
            assert "batch/v1 cronjobs" in missing["detail"] and "1.21" in missing["fix"]
            assert "apps-namespace" not in missing["detail"]
            report = await status(port)
            assert report["fanout"]["Workflow"]["last_error_class"] == reasons.CHILD_API_MISSING
            assert report["fanout"]["ServiceDefinition"]["state"] == "watching"
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def test_fan_out_drift_repair_events_and_conditions(crds: RealKube, tmp_path: Path) -> None:
    kube = crds
    inst = await trio.to_thread.run_sync(kube.install)
    port = free_port()
    config = await daemon_config(tmp_path, inst, port, resync_s=1)
    with trio.fail_after(90):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("fan-out watching", kind="ServiceDefinition")
            await trio.to_thread.run_sync(kube.apply, sd(inst, "web", port=8080, replicas=2))
            await poll_until(lambda: aget_ready(kube, inst, "web"))
            deployment = await aget(kube, deployment_path(inst, "web"))
            assert deployment is not None
            labels = deployment["metadata"]["labels"]
            assert labels["platform.trio-supervisor.dev/installation"] == inst.control
            assert labels["platform.trio-supervisor.dev/servicedefinition"] == "web"
            assert deployment["spec"]["replicas"] == 2
            assert await aget(kube, f"/api/v1/namespaces/{inst.apps}/services/web") is not None
            parent = await aget(kube, parent_path(inst, "web"))
            assert condition(parent, "Ready")["status"] == "True"
            # No controllers run on this server: nothing is available yet.
            assert condition(parent, "Available")["status"] == "False"
            assert not await events(kube, inst, "Applied")  # off by default

            # Nothing drifted: two resyncs pass and nothing is written.
            rv = deployment["metadata"]["resourceVersion"]
            parent_rv = parent["metadata"]["resourceVersion"]  # type: ignore[index]
            unchanged = await metric(port, "supervisor_fanout_applies_total",
                                     kind="ServiceDefinition", result="unchanged")
            await poll_until(lambda: metric_above(port, unchanged + 4))
            assert (await aget(kube, deployment_path(inst, "web")))["metadata"][  # type: ignore[index]
                "resourceVersion"] == rv
            assert (await aget(kube, parent_path(inst, "web")))["metadata"][  # type: ignore[index]
                "resourceVersion"] == parent_rv

            # Deleted by hand: back within a second.
            response = await trio.to_thread.run_sync(
                kube.request, "DELETE", deployment_path(inst, "web"))
            assert response.status_code == 200
            deleted_at = trio.current_time()
            await poll_until(lambda: exists_new(kube, deployment_path(inst, "web"), rv))
            assert trio.current_time() - deleted_at < 1.0
            # Edited by hand (replicas 2 -> 5): repaired within a second.
            response = await trio.to_thread.run_sync(
                kube.request, "PATCH", deployment_path(inst, "web"),
                {"spec": {"replicas": 5}}, "application/merge-patch+json")
            assert response.status_code == 200
            edited_at = trio.current_time()
            await poll_until(lambda: replicas_are(kube, deployment_path(inst, "web"), 2))
            assert trio.current_time() - edited_at < 1.0
            await poll_until(lambda: has_edit_repair(kube, inst))
            # Both repairs within a minute: one Event, counted twice, saying the latest.
            (repaired,) = await events(kube, inst, "DriftRepaired")
            assert repaired["count"] == 2

            # The Deployment controller's part, by hand: Available follows.
            current = await aget(kube, deployment_path(inst, "web"))
            assert current is not None
            response = await trio.to_thread.run_sync(
                kube.request, "PATCH", deployment_path(inst, "web") + "/status",
                {"status": {"observedGeneration": current["metadata"]["generation"],
                            "replicas": 2, "availableReplicas": 2, "readyReplicas": 2}},
                "application/merge-patch+json")
            assert response.status_code == 200
            await poll_until(lambda: available_is(kube, inst, "web", "True"))

            # Update and delete of the parent.
            await trio.to_thread.run_sync(kube.apply, sd(inst, "web", image="nginx:1.28"))
            await poll_until(lambda: service_gone(kube, inst, "web"))
            response = await trio.to_thread.run_sync(
                kube.request, "DELETE", parent_path(inst, "web"))
            assert response.status_code == 200
            await poll_until(lambda: gone(kube, deployment_path(inst, "web")))
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
            assert not [e for e in daemon.lines if "403" in str(e.get("error", ""))]


async def metric_above(port: int, value: float) -> bool:
    return await metric(port, "supervisor_fanout_applies_total", kind="ServiceDefinition",
                        result="unchanged") >= value


async def exists_new(kube: RealKube, path: str, old_rv: str) -> bool:
    found = await aget(kube, path)
    return found is not None and found["metadata"]["resourceVersion"] != old_rv


async def replicas_are(kube: RealKube, path: str, replicas: int) -> bool:
    found = await aget(kube, path)
    return found is not None and found["spec"]["replicas"] == replicas


async def has_edit_repair(kube: RealKube, inst: Installation) -> bool:
    return any("(edited)" in e["message"] for e in await events(kube, inst, "DriftRepaired"))


async def available_is(kube: RealKube, inst: Installation, name: str, value: str) -> bool:
    return condition(await aget(kube, parent_path(inst, name)),
                     "Available").get("status") == value


async def service_gone(kube: RealKube, inst: Installation, name: str) -> bool:
    return await aget(kube, f"/api/v1/namespaces/{inst.apps}/services/{name}") is None


def lost_child(inst: Installation, name: str) -> dict[str, Any]:
    """A Deployment of ours (this installation's labels) whose parent does not exist."""
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "trio-supervisor",
              "platform.trio-supervisor.dev/installation": inst.control,
              "platform.trio-supervisor.dev/servicedefinition": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": inst.apps, "labels": labels},
            "spec": {"selector": {"matchLabels": {"x": name}},
                     "template": {"metadata": {"labels": {"x": name}},
                                  "spec": {"containers": [{"name": "c", "image": "x"}]}}}}


async def deployments(kube: RealKube, inst: Installation) -> list[str]:
    found = await aget(kube, f"/apis/apps/v1/namespaces/{inst.apps}/deployments") or {}
    return sorted(item["metadata"]["name"] for item in found.get("items", []))


async def test_orphan_sweep_at_restart_and_the_sweep_guard(
    crds: RealKube, tmp_path: Path,
) -> None:
    kube = crds
    inst = await trio.to_thread.run_sync(kube.install)
    port = free_port()
    config = await daemon_config(tmp_path, inst, port, resync_s=3)
    with trio.fail_after(90):
        for name in ("a", "b"):
            await trio.to_thread.run_sync(kube.apply, sd(inst, name))
        async with run_daemon(config) as daemon:
            await poll_until(lambda: has_deployments(kube, inst, ["a", "b"]))
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
        # While it is down: one parent deleted (its child is an orphan now), and a child of
        # another installation sharing the apps namespace.
        await trio.to_thread.run_sync(kube.request, "DELETE", parent_path(inst, "b"))
        other = lost_child(inst, "other")
        other["metadata"]["labels"]["platform.trio-supervisor.dev/installation"] = "staging"
        await trio.to_thread.run_sync(kube.apply, other)
        async with run_daemon(config) as daemon:
            await poll_until(lambda: has_deployments(kube, inst, ["a", "other"]))
            swept = await daemon.wait_log("orphan swept", name="b")
            assert swept["parent"] == "b"
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
        # While it is down: eight children whose parents are not in the list appear (as
        # after a wrong parent list; written by us, so sweepable): the sweep is refused,
        # then confirmed by a resync.
        for i in range(8):
            await trio.to_thread.run_sync(
                lambda i=i: kube.apply(lost_child(inst, f"lost-{i}"), manager="trio-supervisor"))
        async with run_daemon(config) as daemon:
            refused = await daemon.wait_log(None, kind="ServiceDefinition", count=8)
            assert refused["level"] == "error" and "sweep refused" in refused["event"]
            assert refused["seen"] == 9
            assert len(await deployments(kube, inst)) == 10
            await poll_until(lambda: has_deployments(kube, inst, ["a", "other"]))
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def has_deployments(kube: RealKube, inst: Installation, names: list[str]) -> bool:
    return await deployments(kube, inst) == sorted(names)


async def test_a_restarted_api_server_answers_410_and_the_daemon_relists(
    crds: RealKube, tmp_path: Path,
) -> None:
    kube = crds
    inst = await trio.to_thread.run_sync(kube.install)
    port = free_port()
    # A roomy lease: the daemon is stopped (SIGSTOP) across the restart and its renewals
    # wait; the leader must not step down meanwhile (its next term would list afresh).
    config = await daemon_config(tmp_path, inst, port, lease_duration_s=90,
                                 renew_deadline_s=60)
    with trio.fail_after(90):
        await trio.to_thread.run_sync(kube.apply, sd(inst, "before"))
        async with run_daemon(config) as daemon:
            await poll_until(lambda: has_deployments(kube, inst, ["before"]))
            # Move etcd's revision on without touching what the daemon watches, then restart
            # the API server: its watch cache starts at the new revision, older is 410.
            for i in range(5):
                await trio.to_thread.run_sync(kube.request, "POST",
                                              f"/api/v1/namespaces/{inst.apps}/configmaps",
                                              {"metadata": {"name": f"cm-{i}"}})
            before = len(daemon.lines)
            # Stopped until the restarted server's RBAC has warmed up (a moment of 403
            # otherwise, which sends the kind back to its preflight and a fresh list:
            # right too, but not the 410 this test is about).
            daemon.signal(signal.SIGSTOP)
            try:
                await trio.to_thread.run_sync(kube.restart_apiserver)
                await poll_until(lambda: sa_can_list(kube, inst))
            finally:
                daemon.signal(signal.SIGCONT)
            relist = {"event": "watch resourceVersion expired; relisting",
                      "resource": "servicedefinitions.platform.trio-supervisor.dev"}
            # A watch that failed to re-open logs "fan-out watching" again once it does;
            # only this line says the kind went back to its preflight and a fresh list.
            fresh = {"event": "fan-out watch lost; back to preflight", "kind": "ServiceDefinition"}

            def seen(want: dict[str, str]) -> list[dict[str, Any]]:
                return [line for line in daemon.lines[before:]
                        if all(line.get(k) == v for k, v in want.items())]

            await poll_until(lambda: bool(seen(relist)))
            assert all(line["level"] == "info" for line in seen(relist))
            await trio.to_thread.run_sync(kube.apply, sd(inst, "after"))
            await poll_until(lambda: has_deployments(kube, inst, ["after", "before"]))
            assert not seen(fresh), "the 410 was answered by a relist, not a preflight"

            async def watching() -> bool:
                report = await status(port)
                return bool(report["fanout"]["ServiceDefinition"]["state"] == "watching")

            await poll_until(watching)  # every re-watch open again
            assert not seen(fresh)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def sa_can_list(kube: RealKube, inst: Installation) -> bool:
    """Can the daemon's ServiceAccount list its parents and children (RBAC warmed up)?"""
    token = yaml.safe_load(inst.kubeconfig.read_text())["users"][0]["user"]["token"]
    paths = [parent_path(inst, "x").rpartition("/")[0], deployment_path(inst, "x").rpartition("/")[0]]

    def probe() -> bool:
        return all(kube.admin.get(path, headers={"Authorization": f"Bearer {token}"})
                   .status_code == 200 for path in paths)

    try:
        return await trio.to_thread.run_sync(probe)
    except httpx.HTTPError:
        return False


async def test_lease_writes_keep_labels_and_refuse_unconditional_puts(kube: RealKube) -> None:
    """The election's Lease calls on the real server, with the manifests' RBAC: acquire,
    renew and release keep labels, annotations and the rest of the object as read; and
    kube-apiserver refuses a Lease PUT without a resourceVersion with the 422 the fake
    reproduces (tests/fakes/apiserver_writes.py)."""
    from datetime import UTC, datetime

    from supervisor.kube.client import KubeClient
    from supervisor.kube.lease import KubeLeases

    inst = await trio.to_thread.run_sync(kube.install)
    path = (f"/apis/coordination.k8s.io/v1/namespaces/{inst.control}"
            "/leases/trio-supervisor-fanout")
    made = await trio.to_thread.run_sync(kube.request, "POST", path.rpartition("/")[0], {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "trio-supervisor-fanout", "namespace": inst.control,
                     "labels": {"app.kubernetes.io/part-of": "trio-supervisor"},
                     "annotations": {"owner": "platform-team"}},
        "spec": {"leaseDurationSeconds": 15}})
    made.raise_for_status()
    with trio.fail_after(60):
        client = KubeClient.from_kubeconfig(str(inst.kubeconfig))
        try:
            leases = KubeLeases(client, inst.control, "trio-supervisor-fanout", "replica-a")
            current = await leases.get()
            assert current is not None and current.holder is None
            now = datetime.now(UTC)
            held = await leases.update(replace(
                current,
                holder="replica-a", duration_s=15, acquire_time=now, renew_time=now,
                transitions=current.transitions + 1))
            renewed = await leases.update(replace(held, renew_time=datetime.now(UTC)))
            assert renewed.resource_version != held.resource_version
            await leases.update(replace(renewed, holder=None, duration_s=1))
        finally:
            await client.aclose()
    stored = await trio.to_thread.run_sync(kube.get, path)
    assert stored is not None
    assert stored["metadata"].get("labels") == {"app.kubernetes.io/part-of": "trio-supervisor"}
    assert stored["metadata"].get("annotations") == {"owner": "platform-team"}
    assert not stored["spec"].get("holderIdentity") and stored["spec"]["leaseTransitions"] == 1
    unconditional = {**stored, "metadata": {**stored["metadata"], "resourceVersion": ""}}
    unconditional.pop("status", None)
    refused = await trio.to_thread.run_sync(kube.request, "PUT", path, unconditional)
    assert refused.status_code == 422, refused.text
    assert "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update" \
        in refused.json()["message"]
