"""The fan-out writes only what is its own, and deletes only what it wrote (fake API server).

An object of a child's name that is not ours (no labels, another installation's,
``managed-by`` alone) is left exactly as it was: the parent is ``Conflict``, a
``Conflict`` Event says so, deleting the parent leaves it, and once it is gone
the next resync converges. A field another manager applied is reported, not
forced. Labels alone never make an object ours to delete. The same on the real
kube-apiserver: tests/integration/test_realkube_ownership.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.fanout.labels import (
    INSTALLATION_KEY,
    LINEAGE_SERVICEDEFINITION,
    MANAGED_BY_KEY,
    MANAGED_BY_VALUE,
    NAME_KEY,
)
from supervisor.kube.applying import ChildKey
from tests.fakes.apiserver import FakeApiServer
from tests.fanout import APPS, CONTROL, Harness, harness, ready, sd

# owner -> (its labels, what the parent's message says of them)
TEAM_LABELS: dict[str, tuple[dict[str, str], str]] = {
    "unlabelled": ({"app": "payments"}, "no managed-by, no installation, no lineage"),
    "another installation": ({MANAGED_BY_KEY: MANAGED_BY_VALUE, INSTALLATION_KEY: "staging",
                              LINEAGE_SERVICEDEFINITION: "payments", "app": "payments"},
                             "belongs to installation staging"),
    "managed-by only": ({MANAGED_BY_KEY: MANAGED_BY_VALUE, "app": "payments"},
                        "managed-by=trio-supervisor, no installation, no lineage"),
}


def team_service(labels: dict[str, str], name: str = "payments") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": APPS, "labels": dict(labels)},
            "spec": {"selector": {"app": name},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


def team_deployment(labels: dict[str, str], name: str = "payments") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": APPS, "labels": dict(labels)},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app",
                                                           "image": "team/payments:7"}]}}}}


def handed_over(name: str, replicas: int) -> dict[str, Any]:
    """A Deployment carrying the three labels, its (immutable) selector the one we set."""
    labels = {MANAGED_BY_KEY: MANAGED_BY_VALUE, INSTALLATION_KEY: CONTROL,
              LINEAGE_SERVICEDEFINITION: name, NAME_KEY: name}
    selector = {NAME_KEY: name, LINEAGE_SERVICEDEFINITION: name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": APPS, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "main",
                                                           "image": "team/app:1"}]}}}}


def conflict_events(fake: FakeApiServer, name: str) -> list[dict[str, Any]]:
    return [e for e in fake.objects("events", CONTROL)
            if e["reason"] == "Conflict" and e["involvedObject"]["name"] == name]


def parent_reason(fake: FakeApiServer, name: str) -> str | None:
    return (ready(fake.get("servicedefinitions", CONTROL, name)) or {}).get("reason")


def parent_message(fake: FakeApiServer, name: str) -> str:
    """The message of the parent's Ready condition."""
    return str(ready(fake.get("servicedefinitions", CONTROL, name))["message"])  # type: ignore[index]


def env_names(fake: FakeApiServer, name: str) -> list[str]:
    """The names of the env variables of Deployment ``name``'s first container."""
    live = fake.get("deployments", APPS, name) or {}
    container = live["spec"]["template"]["spec"]["containers"][0]
    return [e["name"] for e in container.get("env") or []]


async def applied(h: Harness, name: str, **spec: Any) -> None:
    """Parent ``name`` created with ``spec`` and Applied."""
    h.fake.create(sd(name, **spec))
    await h.until(lambda: parent_reason(h.fake, name) == "Applied")


async def resynced(h: Harness) -> None:
    """A full resync, and every reaction to it done."""
    await h.reconciler.resync()
    await h.idle()


async def refused_then_healed(h: Harness, labels: dict[str, str], says: str) -> None:
    """The team's Service and Deployment ``payments`` against a parent of that name."""
    fake = h.fake
    service = fake.create(team_service(labels), field_manager="team")
    deployment = fake.create(team_deployment(labels), field_manager="team")
    fake.create(sd("payments", port=8080))
    await h.until(lambda: parent_reason(fake, "payments") == "Conflict")
    await h.idle()
    # Exactly as they were: labels, selector, ports, replicas, resourceVersion.
    assert fake.get("services", APPS, "payments") == service
    assert fake.get("deployments", APPS, "payments") == deployment
    assert not [r for r in fake.requests
                if r.method in ("PATCH", "PUT", "DELETE") and "/payments" in r.path
                and f"/namespaces/{APPS}/" in r.path]
    message = parent_message(fake, "payments")
    assert f"Service {APPS}/payments" in message and f"Deployment {APPS}/payments" in message
    assert says in message
    (event,) = conflict_events(fake, "payments")
    assert event["type"] == "Warning" and f"Service {APPS}/payments" in event["message"]
    assert h.metric("fanout_applies", kind="ServiceDefinition", result="conflict") >= 1

    # Retried on the resync: still refused, still untouched, still one Event.
    await resynced(h)
    assert fake.get("services", APPS, "payments") == service
    assert len(conflict_events(fake, "payments")) == 1

    # Deleting the parent leaves them.
    fake.delete("servicedefinitions", CONTROL, "payments")
    await h.until(lambda: fake.get("servicedefinitions", CONTROL, "payments") is None)
    await h.idle()
    await resynced(h)
    assert fake.get("services", APPS, "payments") == service
    assert fake.get("deployments", APPS, "payments") == deployment

    # Handed over by removing them: the parent converges at the next resync.
    fake.create(sd("payments", port=8080))
    await h.until(lambda: parent_reason(fake, "payments") == "Conflict")
    fake.delete("services", APPS, "payments")
    fake.delete("deployments", APPS, "payments")
    await h.reconciler.resync()
    await h.until(lambda: parent_reason(fake, "payments") == "Applied")
    ours = fake.get("services", APPS, "payments")
    assert ours is not None and ours["metadata"]["labels"][INSTALLATION_KEY] == CONTROL


@pytest.mark.parametrize("owner", list(TEAM_LABELS))
async def test_an_object_that_is_not_ours_is_left_as_it_was_and_reported(
    tmp_path: Path, owner: str,
) -> None:
    with trio.fail_after(20):
        async with harness(tmp_path) as h:
            await refused_then_healed(h, *TEAM_LABELS[owner])


async def test_an_object_handed_over_by_its_labels_is_adopted(tmp_path: Path) -> None:
    # The three labels are how a team hands an existing object to a parent.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(handed_over("payments", 3), field_manager="team")
            await applied(h, "payments", replicas=2)
            deployment = fake.get("deployments", APPS, "payments")
            assert deployment["spec"]["replicas"] == 2  # type: ignore[index]
            # Its fields were the team's by a create (an update), not applied: one write.
            assert len(fake.find_requests("PATCH", "/deployments/payments")) == 1


async def test_a_field_another_manager_applied_is_reported_not_forced(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await applied(h, "web", replicas=2)
            await h.idle()
            # Another controller declares spec.replicas its own, with an apply.
            fake.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": "web", "namespace": APPS},
                        "spec": {"replicas": 7}}, field_manager="autoscaler", force=True)
            fake.clear_requests()
            fake.patch("servicedefinitions", CONTROL, "web", {"spec": {"replicas": 3}})
            await h.until(lambda: parent_reason(fake, "web") == "Conflict")
            await h.idle()
            assert fake.get("deployments", APPS, "web")["spec"]["replicas"] == 7  # type: ignore[index]
            tries = fake.find_requests("PATCH", "/deployments/web")
            assert tries and all(r.query.get("force") is None for r in tries)
            message = parent_message(fake, "web")
            assert "autoscaler" in message and "not forced" in message
            assert conflict_events(fake, "web")


async def test_two_fields_another_manager_applied_are_reported_not_forced(
    tmp_path: Path,
) -> None:
    # Of two conflicts or more, kube-apiserver writes `conflicts with "m"`, grouped by
    # manager: missed, the refusal was an ApplyFailed retried for ever.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await applied(h, "web", replicas=2)
            await h.idle()
            fake.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": "web", "namespace": APPS,
                                     "labels": {NAME_KEY: "other"}},
                        "spec": {"replicas": 7}}, field_manager="autoscaler", force=True)
            fake.patch("servicedefinitions", CONTROL, "web", {"spec": {"replicas": 3}})
            await h.until(lambda: parent_reason(fake, "web") == "Conflict")
            await h.idle()
            message = parent_message(fake, "web")
            assert "autoscaler" in message and "not forced" in message
            assert h.metric("fanout_requeues", kind="ServiceDefinition", cause="conflict") == 0
            assert fake.get("deployments", APPS, "web")["spec"]["replicas"] == 7  # type: ignore[index]


async def test_a_conflict_with_an_earlier_manager_of_ours_is_forced(tmp_path: Path) -> None:
    # The project's own field manager name, from before the manager was configured
    # otherwise: still ours, so its fields are taken over.
    with trio.fail_after(10):
        async with harness(tmp_path, settings={"field_manager": "platform-fanout"}) as h:
            fake = h.fake
            fake.apply(handed_over("web", 9), field_manager="trio-supervisor", force=True)
            await applied(h, "web", replicas=2)
            assert fake.get("deployments", APPS, "web")["spec"]["replicas"] == 2  # type: ignore[index]
            forced = [r for r in fake.find_requests("PATCH", "/deployments/web")
                      if r.query.get("force") == "true"]
            assert len(forced) == 1


@pytest.mark.parametrize("lineage", ["ghost", "web"])
async def test_our_labels_patched_onto_an_unrelated_object_never_get_it_deleted(
    tmp_path: Path, lineage: str,
) -> None:
    # Merge-patching our three labels onto a team's Service "ledger" got it deleted by
    # the orphan sweep (lineage naming a parent that does not exist) or by the reconcile
    # of the parent it names: labels are anyone's to patch.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await applied(h, "web")
            fake.create(team_service({"app": "ledger"}, "ledger"), field_manager="team")
            fake.patch("services", APPS, "ledger", {"metadata": {"labels": {
                MANAGED_BY_KEY: MANAGED_BY_VALUE, INSTALLATION_KEY: CONTROL,
                LINEAGE_SERVICEDEFINITION: lineage}}}, field_manager="kubectl-patch")
            ledger = fake.get("services", APPS, "ledger")
            await h.until(lambda: h.reconciler.live.get(ChildKey("services", "ledger")) is not None)
            await h.idle()
            await resynced(h)
            assert fake.get("services", APPS, "ledger") == ledger
            assert fake.find_requests("DELETE", "/services/ledger") == []
            # What we did write is still swept when its parent goes.
            fake.delete("servicedefinitions", CONTROL, "web")
            await h.until(lambda: fake.get("deployments", APPS, "web") is None)
            assert fake.get("services", APPS, "ledger") == ledger


async def test_a_child_whose_managed_fields_were_reset_is_written_again_and_still_deleted(
    tmp_path: Path,
) -> None:
    # `kubectl patch --type=merge -p '{"metadata":{"managedFields":[{}]}}'` on a child
    # of ours leaves it with our labels and our fields but no entry of ours: nothing
    # differed, so nothing was written, and deleting its parent left it behind forever
    # (never written by us, as far as managedFields said).
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await applied(h, "web", port=8080)
            await h.idle()
            service = fake.get("services", APPS, "web")
            assert service is not None
            reset = {**service, "metadata": {**service["metadata"], "managedFields": []}}
            fake.clear_requests()
            fake.put_raw(reset)
            assert "managedFields" not in fake.get("services", APPS, "web")["metadata"]  # type: ignore[index]
            await h.until(lambda: "managedFields" in fake.get(  # type: ignore[index]
                "services", APPS, "web")["metadata"])
            await h.idle()
            await resynced(h)
            # One apply recorded our entry again; nothing written since.
            assert len(fake.find_requests("PATCH", f"/namespaces/{APPS}/services/web")) == 1
            fake.delete("servicedefinitions", CONTROL, "web")
            await h.until(lambda: fake.get("services", APPS, "web") is None)
            assert fake.get("deployments", APPS, "web") is None


async def test_a_child_whose_labels_a_user_removed_is_left_to_them_and_reported(
    tmp_path: Path,
) -> None:
    # Removing our labels is taking the object: never fought over, never deleted, the
    # parent says Conflict naming it.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await applied(h, "web", port=8080)
            await h.idle()
            fake.patch("services", APPS, "web", {"metadata": {"labels": {
                MANAGED_BY_KEY: None, INSTALLATION_KEY: None,
                LINEAGE_SERVICEDEFINITION: None}}}, field_manager="kubectl-label")
            taken = fake.get("services", APPS, "web")
            await h.until(lambda: parent_reason(fake, "web") == "Conflict")
            await resynced(h)
            assert fake.get("services", APPS, "web") == taken
            assert f"Service {APPS}/web exists and is not ours" in parent_message(fake, "web")
            fake.delete("servicedefinitions", CONTROL, "web")
            await h.until(lambda: fake.get("deployments", APPS, "web") is None)
            await resynced(h)
            assert fake.get("services", APPS, "web") == taken


async def test_an_object_gone_between_our_409_and_our_look_at_it_is_created_on_the_retry(
    tmp_path: Path,
) -> None:
    # The POST is refused (a team's Service of that name), which is gone when we look:
    # that was reported as a failed write (ApplyFailed, "went away meanwhile", Ready
    # Conflict) and retried after the backoff, though nothing was in the way any more.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(team_service({"app": "web"}, "web"), field_manager="team")
            await fake.wait_for_watches(2, "services")  # ours and other installations'
            held = fake.hold("GET", rf"/namespaces/{APPS}/services$")
            fake.create(sd("web", port=8080))
            await h.until(lambda: held.arrived == 1)
            fake.delete("services", APPS, "web")
            held.release()
            await h.until(lambda: parent_reason(fake, "web") == "Applied")
            ours = fake.get("services", APPS, "web")
            assert ours is not None and ours["metadata"]["labels"][INSTALLATION_KEY] == CONTROL
            assert not conflict_events(fake, "web")
            posts = fake.find_requests("POST", f"/namespaces/{APPS}/services")
            assert [r.status for r in posts] == [409, 201]
            # Created again at once: no failed write said, no backoff waited.
            assert [e["reason"] for e in fake.objects("events", CONTROL)] == []
            assert h.metric("fanout_requeues", kind="ServiceDefinition", cause="conflict") == 0


async def test_a_field_the_parent_stops_setting_is_removed_from_a_child_we_created(
    tmp_path: Path,
) -> None:
    # The create's POST left our manager's Update entry co-owning every field it set:
    # an apply that stops setting one removed nothing.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await applied(h, "web", env={"KEEP": "1", "DROP": "2"})
            await h.idle()
            fake.patch("servicedefinitions", CONTROL, "web", {"spec": {"env": {"DROP": None}}})
            await h.until(lambda: env_names(fake, "web") == ["KEEP"])
            entries = fake.get("deployments", APPS, "web")["metadata"]["managedFields"]  # type: ignore[index]
            assert [(e["manager"], e["operation"]) for e in entries] == [
                ("trio-supervisor", "Apply")]


async def test_a_fold_refused_by_its_resource_version_test_is_retried_not_invalid(
    tmp_path: Path,
) -> None:
    # The fold's JSON patch tests the resourceVersion; a write between our look and it
    # fails that test (422), a race to retry, never a child refused as Invalid.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await applied(h, "web", env={"KEEP": "1", "DROP": "2"})
            await h.idle()
            fake.inject("PATCH", rf"/namespaces/{APPS}/deployments/web$", status=422, times=1)
            fake.patch("servicedefinitions", CONTROL, "web", {"spec": {"env": {"DROP": None}}})
            await h.until(lambda: env_names(fake, "web") == ["KEEP"])
            await h.until(lambda: parent_reason(fake, "web") == "Applied")
            assert not [e for e in fake.objects("events", CONTROL) if e["reason"] == "Invalid"]
