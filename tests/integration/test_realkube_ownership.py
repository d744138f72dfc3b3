"""The real daemon against a real kube-apiserver: it writes only what is its own.

A team's Service and Deployment of a parent's name (unlabelled, another
installation's, or carrying ``managed-by`` alone) are left exactly as they
were (labels, selector, ports, replicas: the same resourceVersion), the parent
reports ``Conflict``, a ``Conflict`` Event says so, deleting the parent leaves
them, and once they are removed the parent converges. Our three labels
merge-patched onto an unrelated Service never get it deleted. Skipped with the
reason when ``SUPERVISOR_TEST_KUBE_ASSETS`` is unset (tests/realkube.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.health import metric
from tests.polling import poll_until
from tests.proc import EXAMPLE, Daemon, acli, free_port, run_daemon, write_config
from tests.realkube import Installation, RealKube, start_realkube

GROUP = "platform.trio-supervisor.dev/v1"
MANAGED_BY = "app.kubernetes.io/managed-by"
INSTALLATION = "platform.trio-supervisor.dev/installation"
LINEAGE = "platform.trio-supervisor.dev/servicedefinition"

# owner -> (its labels; None: this installation's own namespace goes in) and what the
# parent's message says of it
OWNERS: dict[str, tuple[dict[str, str], str]] = {
    "unlabelled": ({"app": "payments"}, "no managed-by, no installation, no lineage"),
    "another installation": ({MANAGED_BY: "trio-supervisor", INSTALLATION: "staging",
                              LINEAGE: "payments", "app": "payments"},
                             "belongs to installation staging"),
    "managed-by only": ({MANAGED_BY: "trio-supervisor", "app": "payments"},
                        "managed-by=trio-supervisor, no installation, no lineage"),
}


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    with start_realkube(tmp_path_factory.mktemp("kube")) as server:
        if not server.crds_installed:
            server.install_crds()
        yield server


def sd(inst: Installation, name: str, *, port: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": "nginx:1.27"}
    if port is not None:
        spec["port"] = port
    return {"apiVersion": GROUP, "kind": "ServiceDefinition",
            "metadata": {"name": name, "namespace": inst.control}, "spec": spec}


def team_service(inst: Installation, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": inst.apps, "labels": labels},
            "spec": {"selector": {"app": name},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                "protocol": "TCP"}]}}


def team_deployment(inst: Installation, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": inst.apps, "labels": labels},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app",
                                                           "image": "team/payments:7"}]}}}}


def service_path(inst: Installation, name: str) -> str:
    return f"/api/v1/namespaces/{inst.apps}/services/{name}"


def deployment_path(inst: Installation, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{inst.apps}/deployments/{name}"


def parent_path(inst: Installation, name: str) -> str:
    return f"/apis/{GROUP}/namespaces/{inst.control}/servicedefinitions/{name}"


async def aget(kube: RealKube, path: str) -> dict[str, Any] | None:
    return await trio.to_thread.run_sync(kube.get, path)


async def ready(kube: RealKube, inst: Installation, name: str) -> dict[str, Any]:
    parent = await aget(kube, parent_path(inst, name)) or {}
    for cond in (parent.get("status") or {}).get("conditions") or []:
        if cond["type"] == "Ready":
            return cond  # type: ignore[no-any-return]
    return {}


async def reason_is(kube: RealKube, inst: Installation, name: str, reason: str) -> bool:
    return (await ready(kube, inst, name)).get("reason") == reason


async def conflict_events(kube: RealKube, inst: Installation) -> list[dict[str, Any]]:
    found = await aget(kube, f"/api/v1/namespaces/{inst.control}/events") or {}
    return [e for e in found.get("items", []) if e["reason"] == "Conflict"]


async def applies(port: int, result: str) -> float:
    return await metric(port, "supervisor_fanout_applies_total", kind="ServiceDefinition",
                        result=result)


async def above(port: int, result: str, value: float) -> bool:
    return await applies(port, result) >= value


async def daemon_config(tmp_path: Path, inst: Installation, port: int) -> Path:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", inst.toml(resync_s=1),
                          port=port)
    await acli("publish", "--config", str(config), str(EXAMPLE))
    return config


async def installed(kube: RealKube, tmp_path: Path) -> tuple[Installation, int, Path]:
    """A fresh installation, the daemon's admin port, and its config with EXAMPLE published."""
    inst = await trio.to_thread.run_sync(kube.install)
    port = free_port()
    return inst, port, await daemon_config(tmp_path, inst, port)


@asynccontextmanager
async def watching(config: Path) -> AsyncIterator[Daemon]:
    """The daemon, once its fan-out watches ServiceDefinitions."""
    async with run_daemon(config) as daemon:
        await daemon.wait_log("fan-out watching", kind="ServiceDefinition")
        yield daemon


@asynccontextmanager
async def fanning_out(
        kube: RealKube, tmp_path: Path) -> AsyncIterator[tuple[Installation, int, Daemon]]:
    """:func:`installed`, then :func:`watching`, all within 120 s."""
    inst, port, config = await installed(kube, tmp_path)
    with trio.fail_after(120):
        async with watching(config) as daemon:
            yield inst, port, daemon


async def applied(kube: RealKube, inst: Installation, parent: dict[str, Any]) -> None:
    """``parent`` applied, and its Ready reason Applied."""
    await trio.to_thread.run_sync(kube.apply, parent)
    await poll_until(lambda: reason_is(kube, inst, parent["metadata"]["name"], "Applied"))


async def merge_patch(kube: RealKube, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The object at ``path`` after a merge patch of ``body`` (which must succeed)."""
    response = await trio.to_thread.run_sync(
        kube.request, "PATCH", path, body, "application/merge-patch+json")
    assert response.status_code == 200
    return dict(response.json())


def seen(obj: dict[str, Any] | None) -> tuple[Any, ...]:
    """What must not change of a team's object: labels, spec, resourceVersion."""
    assert obj is not None
    metadata = obj["metadata"]
    return (metadata.get("labels"), obj["spec"], metadata["resourceVersion"])


@pytest.mark.parametrize("owner", list(OWNERS))
async def test_a_team_object_of_a_parents_name_is_left_as_it_was(
    kube: RealKube, tmp_path: Path, owner: str,
) -> None:
    labels, says = OWNERS[owner]
    inst, port, config = await installed(kube, tmp_path)
    with trio.fail_after(120):
        service = await trio.to_thread.run_sync(
            lambda: kube.apply(team_service(inst, "payments", labels), manager="team"))
        deployment = await trio.to_thread.run_sync(
            lambda: kube.apply(team_deployment(inst, "payments", labels), manager="team"))
        async with watching(config):
            await trio.to_thread.run_sync(kube.apply, sd(inst, "payments", port=8080))
            await poll_until(lambda: reason_is(kube, inst, "payments", "Conflict"))
            message = (await ready(kube, inst, "payments"))["message"]
            assert f"Service {inst.apps}/payments" in message
            assert f"Deployment {inst.apps}/payments" in message
            assert says in message
            (event,) = await conflict_events(kube, inst)
            assert event["type"] == "Warning" and "payments" in event["message"]
            # Retried on each resync (1 s here), and left alone every time.
            tries = await applies(port, "conflict")
            await poll_until(lambda: above(port, "conflict", tries + 2))
            assert seen(await aget(kube, service_path(inst, "payments"))) == seen(service)
            assert seen(await aget(kube, deployment_path(inst, "payments"))) == seen(deployment)
            assert service["spec"]["selector"] == {"app": "payments"}
            assert deployment["spec"]["replicas"] == 3

            # Deleting the parent leaves them.
            response = await trio.to_thread.run_sync(
                kube.request, "DELETE", parent_path(inst, "payments"))
            assert response.status_code == 200
            await poll_until(lambda: gone(kube, parent_path(inst, "payments")))
            await applied(kube, inst, sd(inst, "other"))
            unchanged = await applies(port, "unchanged")
            await poll_until(lambda: above(port, "unchanged", unchanged + 2))  # 2 resyncs
            assert seen(await aget(kube, service_path(inst, "payments"))) == seen(service)
            assert seen(await aget(kube, deployment_path(inst, "payments"))) == seen(deployment)

            # Removing the team's objects lets a parent of that name converge.
            await trio.to_thread.run_sync(kube.apply, sd(inst, "payments", port=8080))
            await poll_until(lambda: reason_is(kube, inst, "payments", "Conflict"))
            for path in (service_path(inst, "payments"), deployment_path(inst, "payments")):
                await trio.to_thread.run_sync(kube.request, "DELETE", path)
            await poll_until(lambda: reason_is(kube, inst, "payments", "Applied"))
            ours = await aget(kube, service_path(inst, "payments"))
            assert ours is not None and ours["metadata"]["labels"][INSTALLATION] == inst.control


async def test_our_labels_merge_patched_onto_a_team_service_never_get_it_deleted(
    kube: RealKube, tmp_path: Path,
) -> None:
    async with fanning_out(kube, tmp_path) as (inst, port, daemon):
        await applied(kube, inst, sd(inst, "web", port=8080))
        await trio.to_thread.run_sync(
            lambda: kube.apply(team_service(inst, "ledger", {"app": "ledger"}),
                               manager="team"))
        for lineage in ("ghost", "web"):  # no such parent; then an existing one
            ledger = await merge_patch(kube, service_path(inst, "ledger"), {"metadata": {
                "labels": {MANAGED_BY: "trio-supervisor", INSTALLATION: inst.control,
                           LINEAGE: lineage}}})
            await daemon.wait_log("an object carries our labels but was never written by"
                                  " us; " + ("not swept" if lineage == "ghost"
                                             else "not deleted"))
            # Two resyncs more (1 s each, web's two children unchanged in each).
            unchanged = await applies(port, "unchanged")
            await poll_until(lambda u=unchanged: above(port, "unchanged", u + 4))
            assert seen(await aget(kube, service_path(inst, "ledger"))) == seen(ledger)
        # What we did write still goes with its parent.
        await trio.to_thread.run_sync(kube.request, "DELETE", parent_path(inst, "web"))
        await poll_until(lambda: gone(kube, deployment_path(inst, "web")))
        assert await aget(kube, service_path(inst, "ledger")) is not None


async def gone(kube: RealKube, path: str) -> bool:
    return await aget(kube, path) is None


async def test_a_child_whose_managed_fields_were_reset_still_goes_with_its_parent(
    kube: RealKube, tmp_path: Path,
) -> None:
    # `metadata.managedFields: [{}]` strips every entry (the reset's own request records
    # none): our child then looked never written by us, and its parent's deletion left it.
    async with fanning_out(kube, tmp_path) as (inst, _, _):
        await applied(kube, inst, sd(inst, "web", port=8080))
        reset = await merge_patch(kube, service_path(inst, "web"),
                                  {"metadata": {"managedFields": [{}]}})
        assert not reset["metadata"].get("managedFields")

        async def ours_again() -> bool:
            service = await aget(kube, service_path(inst, "web")) or {}
            entries = service.get("metadata", {}).get("managedFields") or []
            return any(e.get("manager") == "trio-supervisor" for e in entries)

        await poll_until(ours_again)
        await trio.to_thread.run_sync(kube.request, "DELETE", parent_path(inst, "web"))
        await poll_until(lambda: gone(kube, service_path(inst, "web")))
        await poll_until(lambda: gone(kube, deployment_path(inst, "web")))


async def test_a_child_whose_labels_a_user_removed_is_left_to_them(
    kube: RealKube, tmp_path: Path,
) -> None:
    # The watch's selector no longer matches it (a DELETED event to us): never recreated
    # over it nor deleted, the parent says Conflict; deleting the parent leaves it.
    async with fanning_out(kube, tmp_path) as (inst, port, _):
        await applied(kube, inst, sd(inst, "web", port=8080))
        taken = await merge_patch(kube, service_path(inst, "web"), {"metadata": {"labels": {
            MANAGED_BY: None, INSTALLATION: None, LINEAGE: None}}})
        await poll_until(lambda: reason_is(kube, inst, "web", "Conflict"))
        assert f"Service {inst.apps}/web exists and is not ours" in (
            await ready(kube, inst, "web"))["message"]
        tries = await applies(port, "conflict")
        await poll_until(lambda: above(port, "conflict", tries + 2))  # two resyncs
        assert seen(await aget(kube, service_path(inst, "web"))) == seen(taken)
        await trio.to_thread.run_sync(kube.request, "DELETE", parent_path(inst, "web"))
        await poll_until(lambda: gone(kube, deployment_path(inst, "web")))
        assert seen(await aget(kube, service_path(inst, "web"))) == seen(taken)


async def test_a_field_another_manager_force_applied_on_our_child_is_reported_not_forced(
    kube: RealKube, tmp_path: Path,
) -> None:
    # `kubectl apply --server-side --force-conflicts` by a team on our Deployment takes
    # spec.replicas from us: a declared owner, so a Conflict naming it, never forced
    # back (the real server's conflict message is what names the manager).
    async with fanning_out(kube, tmp_path) as (inst, port, _):
        await applied(kube, inst, sd(inst, "web"))
        await trio.to_thread.run_sync(lambda: kube.apply(
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "web", "namespace": inst.apps},
             "spec": {"replicas": 7}}, manager="team-hpa"))
        spec = sd(inst, "web")
        spec["spec"]["replicas"] = 3
        await trio.to_thread.run_sync(kube.apply, spec)
        await poll_until(lambda: reason_is(kube, inst, "web", "Conflict"))
        message = (await ready(kube, inst, "web"))["message"]
        assert "team-hpa" in message and "not forced" in message
        # Never forced, and nothing written again on the resyncs (our create's
        # entry folded into our apply entry once, the team's replicas untouched).
        before = await aget(kube, deployment_path(inst, "web"))
        tries = await applies(port, "conflict")
        await poll_until(lambda: above(port, "conflict", tries + 2))  # two resyncs
        live = await aget(kube, deployment_path(inst, "web"))
        assert live is not None and before is not None and live["spec"]["replicas"] == 7
        assert live["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert ("team-hpa", "Apply") in [(m["manager"], m["operation"])
                                         for m in live["metadata"]["managedFields"]]


async def test_a_field_the_parent_stops_setting_is_removed_from_a_child_we_created(
    kube: RealKube, tmp_path: Path,
) -> None:
    # A child is created with a POST: its fields are then also held by our manager's
    # Update entry (kube-apiserver keys managers by name and operation), and an apply
    # that no longer sets one removes it only if no other entry holds it.
    async with fanning_out(kube, tmp_path) as (inst, _, _):
        parent = sd(inst, "web")
        parent["spec"]["env"] = {"KEEP": "1", "DROP": "2"}
        await applied(kube, inst, parent)
        created = await aget(kube, deployment_path(inst, "web"))
        assert created is not None
        parent["spec"]["env"] = {"KEEP": "1"}
        await trio.to_thread.run_sync(kube.apply, parent)

        async def reapplied() -> bool:
            live = await aget(kube, deployment_path(inst, "web")) or {}
            return bool(live["metadata"]["generation"] > created["metadata"]["generation"])

        await poll_until(reapplied)
        live = await aget(kube, deployment_path(inst, "web"))
        assert live is not None
        env = live["spec"]["template"]["spec"]["containers"][0].get("env") or []
        assert [e["name"] for e in env] == ["KEEP"]
