"""The fake Kubernetes API server (tests/fakes/apiserver.py), exercised over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.fakes.apiserver import (
    ApiError,
    FakeApiServer,
    FakeControl,
    run_fake_apiserver,
    write_kubeconfig,
)

REPO = Path(__file__).resolve().parents[2]
SD = "/apis/platform.trio-supervisor.dev/v1/namespaces/trio-supervisor/servicedefinitions"
WF = "/apis/platform.trio-supervisor.dev/v1/namespaces/trio-supervisor/workflows"
DEP = "/apis/apps/v1/namespaces/apps/deployments"
SVC = "/api/v1/namespaces/apps/services"
CJ = "/apis/batch/v1/namespaces/apps/cronjobs"
APPLY = {"content-type": "application/apply-patch+yaml"}
MERGE = {"content-type": "application/merge-patch+json"}


def sd(name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "platform.trio-supervisor.dev/v1",
        "kind": "ServiceDefinition",
        "metadata": {"name": name, **({"labels": labels} if labels else {})},
        "spec": {"image": "nginx:1", **spec},
    }


def deployment(name: str, *, replicas: int | None = None, image: str = "nginx:1",
               labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": name}},
            "spec": {"containers": [{"name": "main", "image": image}]},
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "apps", "labels": labels or {}},
        "spec": spec,
    }


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with run_fake_apiserver(bookmark_interval_s=0.05) as server:
        yield server


@pytest.fixture
async def client(api: FakeApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=10.0) as c:
        yield c


async def apply(client: httpx.AsyncClient, path: str, obj: dict[str, Any], manager: str = "sup",
                force: bool = False) -> httpx.Response:
    params = {"fieldManager": manager}
    if force:
        params["force"] = "true"
    return await client.patch(path, params=params, content=json.dumps(obj), headers=APPLY)


async def watch_events(client: httpx.AsyncClient, path: str, params: dict[str, str],
                       count: int | None = None) -> list[dict[str, Any]]:
    """Read events until ``count`` arrived (or the server ends the stream)."""
    events: list[dict[str, Any]] = []
    async with client.stream("GET", path, params={"watch": "1", **params}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.strip():
                events.append(json.loads(line))
            if count is not None and len(events) >= count:
                break
    return events


def rv_of(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


# ------------------------------------------------------------------------- basics, RV, apply


async def test_resource_version_increments_and_noop_apply_keeps_it(
        api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        r1 = await client.post(SD, json=sd("a"))
        r2 = await client.post(SD, json=sd("b"))
        assert r1.status_code == r2.status_code == 201
        a, b = r1.json(), r2.json()
        assert rv_of(b) == rv_of(a) + 1
        assert a["metadata"]["uid"] and a["metadata"]["creationTimestamp"]
        assert a["metadata"]["generation"] == 1
        assert isinstance(a["metadata"]["resourceVersion"], str)

        first = await apply(client, f"{DEP}/web", deployment("web", replicas=2))
        assert first.status_code == 201
        writes_before = len(api.writes())
        again = await apply(client, f"{DEP}/web", deployment("web", replicas=2))
        assert again.status_code == 200
        assert again.json()["metadata"]["resourceVersion"] == first.json()["metadata"][
            "resourceVersion"]
        assert again.json()["metadata"]["generation"] == 1
        assert len(api.writes()) == writes_before
        assert api.resource_version == rv_of(first.json())

        changed = await apply(client, f"{DEP}/web", deployment("web", replicas=3))
        assert rv_of(changed.json()) == api.resource_version > rv_of(first.json())
        assert changed.json()["metadata"]["generation"] == 2
        assert api.writes()[-1].method == "PATCH"
        assert api.writes()[-1].content_type == "application/apply-patch+yaml"
        assert api.writes()[-1].field_manager == "sup"


async def test_apply_requires_field_manager_and_accepts_yaml(client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        r = await client.patch(f"{SD}/y", content=json.dumps(sd("y")), headers=APPLY)
        assert r.status_code == 400
        assert r.json()["kind"] == "Status"
        yaml_body = (
            "apiVersion: platform.trio-supervisor.dev/v1\nkind: ServiceDefinition\n"
            "metadata:\n  name: y\n  annotations:\n    at: 2024-01-01T00:00:00Z\n"
            "spec:\n  image: redis:7\n  replicas: 2\n"
        )
        r = await client.patch(f"{SD}/y", params={"fieldManager": "m"}, content=yaml_body,
                               headers=APPLY)
        assert r.status_code == 201, r.text
        assert r.json()["spec"] == {"image": "redis:7", "replicas": 2}
        assert r.json()["metadata"]["annotations"] == {"at": "2024-01-01T00:00:00Z"}


async def test_apply_conflict_force_and_field_removal(api: FakeApiServer,
                                                      client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await apply(client, f"{DEP}/web", deployment("web", replicas=2), manager="sup")
        # someone edits replicas with a merge patch: they now own spec.replicas
        r = await client.patch(f"{DEP}/web", params={"fieldManager": "kubectl-edit"},
                               json={"spec": {"replicas": 5}}, headers=MERGE)
        assert r.status_code == 200
        managers = {m["manager"]: m["operation"] for m in r.json()["metadata"]["managedFields"]}
        assert managers == {"sup": "Apply", "kubectl-edit": "Update"}

        r = await apply(client, f"{DEP}/web", deployment("web", replicas=2), manager="sup")
        assert r.status_code == 409
        status = r.json()
        assert status["reason"] == "Conflict"
        assert status["details"]["causes"][0]["field"] == ".spec.replicas"
        assert "kubectl-edit" in status["message"]

        # same value as the other manager's: shared, no conflict
        r = await apply(client, f"{DEP}/web", deployment("web", replicas=5), manager="sup")
        assert r.status_code == 200

        r = await apply(client, f"{DEP}/web", deployment("web", replicas=2), manager="sup",
                        force=True)
        assert r.status_code == 200
        assert r.json()["spec"]["replicas"] == 2

        # labels the manager stops applying are removed
        with_label = deployment("web", replicas=2, labels={"tier": "web"})
        r = await apply(client, f"{DEP}/web", with_label)
        assert r.json()["metadata"]["labels"] == {"tier": "web"}
        r = await apply(client, f"{DEP}/web", deployment("web", replicas=2))
        assert "tier" not in (r.json()["metadata"].get("labels") or {})
        # a field dropped from the applied config falls back to its default
        r = await apply(client, f"{DEP}/web", deployment("web"))
        assert r.json()["spec"]["replicas"] == 1


async def test_defaults_are_filled_and_reapply_is_still_a_noop(client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        svc = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "apps"},
               "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]}}
        first = (await apply(client, f"{SVC}/web", svc)).json()
        assert first["spec"]["type"] == "ClusterIP"
        assert first["spec"]["clusterIP"].startswith("10.96.")
        assert first["spec"]["ports"] == [{"name": "http", "port": 80, "protocol": "TCP",
                                           "targetPort": 80}]
        again = (await apply(client, f"{SVC}/web", svc)).json()
        assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        assert again["spec"]["clusterIP"] == first["spec"]["clusterIP"]

        dep = (await apply(client, f"{DEP}/web", deployment("web", image="nginx"))).json()
        pod = dep["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "Always" and pod["dnsPolicy"] == "ClusterFirst"
        assert pod["containers"][0]["imagePullPolicy"] == "Always"  # no tag: latest
        assert (await apply(client, f"{DEP}/web", deployment("web", image="nginx"))).json()[
            "metadata"]["resourceVersion"] == dep["metadata"]["resourceVersion"]


# ------------------------------------------------------------------------- lists


async def test_list_shape_and_pagination(api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        for i in range(5):
            api.create(sd(f"s{i}") | {"metadata": {"name": f"s{i}",
                                                   "namespace": "trio-supervisor"}})
        r = await client.get(SD, params={"limit": "2"})
        page = r.json()
        assert page["kind"] == "ServiceDefinitionList"
        assert page["apiVersion"] == "platform.trio-supervisor.dev/v1"
        assert page["metadata"]["resourceVersion"] == str(api.resource_version)
        assert page["metadata"]["remainingItemCount"] == 3
        assert all(i["kind"] == "ServiceDefinition" for i in page["items"])
        names = [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"]["continue"]
        while token:
            nxt = (await client.get(SD, params={"limit": "2", "continue": token})).json()
            names += [i["metadata"]["name"] for i in nxt["items"]]
            token = nxt["metadata"].get("continue")
        assert names == [f"s{i}" for i in range(5)]

        all_ns = (await client.get("/apis/platform.trio-supervisor.dev/v1/servicedefinitions"))
        assert len(all_ns.json()["items"]) == 5


async def test_label_and_field_selectors(api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        for name, labels in [("a", {"env": "prod", "tier": "web"}), ("b", {"env": "dev"}),
                             ("c", {"tier": "db"}), ("d", {})]:
            api.create({**sd(name, labels=labels or None),
                        "metadata": {"name": name, "namespace": "trio-supervisor",
                                     "labels": labels}})

        async def names(selector: str) -> list[str]:
            r = await client.get(SD, params={"labelSelector": selector})
            assert r.status_code == 200, r.text
            return [i["metadata"]["name"] for i in r.json()["items"]]

        assert await names("env=prod") == ["a"]
        assert await names("env==prod") == ["a"]
        assert await names("env!=prod") == ["b", "c", "d"]
        assert await names("env") == ["a", "b"]
        assert await names("!env") == ["c", "d"]
        assert await names("env in (prod, dev)") == ["a", "b"]
        assert await names("env notin (prod)") == ["b", "c", "d"]
        assert await names("env,tier") == ["a"]
        assert await names("tier in (web,db),!env") == ["c"]
        bad = await client.get(SD, params={"labelSelector": "env in prod"})
        assert bad.status_code == 400 and bad.json()["kind"] == "Status"

        r = await client.get(SD, params={"fieldSelector": "metadata.name=b"})
        assert [i["metadata"]["name"] for i in r.json()["items"]] == ["b"]
        assert api.objects("servicedefinitions", label_selector="env")[0]["metadata"][
            "name"] == "a"


async def test_namespaces_missing_and_present(client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        r = await client.post("/apis/platform.trio-supervisor.dev/v1/namespaces/nope/"
                              "servicedefinitions", json=sd("x"))
        assert r.status_code == 404
        assert r.json() | {"details": None} == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": 'namespaces "nope" not found', "reason": "NotFound", "code": 404,
            "details": None}
        r = await client.get("/apis/apps/v1/namespaces/nope/deployments")
        assert r.status_code == 200 and r.json()["items"] == []
        r = await client.get("/api/v1/namespaces/apps")
        assert r.json()["status"]["phase"] == "Active"
        r = await client.post("/api/v1/namespaces", json={"metadata": {"name": "extra"}})
        assert r.status_code == 201
        r = await client.post("/apis/apps/v1/namespaces/extra/deployments",
                              json=deployment("d") | {"metadata": {"name": "d"}})
        assert r.status_code == 201, r.text
        r = await client.delete("/api/v1/namespaces/extra")
        assert r.status_code == 200
        r = await client.get("/apis/apps/v1/namespaces/extra/deployments/d")
        assert r.status_code == 404


# ------------------------------------------------------------------------- writes


async def test_conflicts_on_create_and_stale_put(client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        assert (await client.post(SD, json=sd("a"))).status_code == 201
        r = await client.post(SD, json=sd("a"))
        assert r.status_code == 409 and r.json()["reason"] == "AlreadyExists"

        obj = (await client.get(f"{SD}/a")).json()
        obj["spec"]["replicas"] = 4
        ok = await client.put(f"{SD}/a", json=obj)
        assert ok.status_code == 200 and ok.json()["spec"]["replicas"] == 4
        obj["spec"]["replicas"] = 5  # still carries the old resourceVersion
        stale = await client.put(f"{SD}/a", json=obj)
        assert stale.status_code == 409
        assert stale.json()["reason"] == "Conflict"
        assert "the object has been modified" in stale.json()["message"]
        assert (await client.get(f"{SD}/a")).json()["spec"]["replicas"] == 4

        r = await client.put(f"{SD}/missing", json=sd("missing"))
        assert r.status_code == 404 and r.json()["reason"] == "NotFound"


async def test_delete_returns_object_and_honours_preconditions(
        api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        created = (await client.post(SD, json=sd("a"))).json()
        r = await client.request("DELETE", f"{SD}/a", json={
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"resourceVersion": "1"}})
        assert r.status_code == 409
        r = await client.delete(f"{SD}/a")
        assert r.status_code == 200
        assert r.json()["metadata"]["uid"] == created["metadata"]["uid"]
        assert rv_of(r.json()) == api.resource_version
        assert (await client.delete(f"{SD}/a")).status_code == 404

        for name in ("x", "y", "z"):
            api.create({**sd(name, labels={"k": "v" if name != "z" else "w"}),
                        "metadata": {"name": name, "namespace": "trio-supervisor",
                                     "labels": {"k": "v" if name != "z" else "w"}}})
        r = await client.delete(SD, params={"labelSelector": "k=v"})
        assert [i["metadata"]["name"] for i in r.json()["items"]] == ["x", "y"]
        assert [o["metadata"]["name"] for o in api.objects("servicedefinitions")] == ["z"]


async def test_validation_errors_are_422(client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        r = await client.post(SD, json=sd("a", replicas="three"))
        assert r.status_code == 422
        assert r.json()["reason"] == "Invalid"
        assert r.json()["details"]["causes"][0]["field"] == "spec.replicas"
        bad = deployment("web")
        bad["spec"]["template"]["metadata"]["labels"] = {"other": "x"}
        r = await apply(client, f"{DEP}/web", bad)
        assert r.status_code == 422
        assert "selector" in r.json()["message"]
        cron: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "CronJob",
                "metadata": {"name": "nightly", "namespace": "apps"},
                "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {
                    "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}}}}
        r = await apply(client, f"{CJ}/nightly", cron)
        assert r.status_code == 422 and "restartPolicy" in r.json()["message"]
        cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "Never"
        r = await apply(client, f"{CJ}/nightly", cron)
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["concurrencyPolicy"] == "Allow"


async def test_json_patch_and_strategic_merge(client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await client.post(SD, json=sd("a"))
        r = await client.patch(f"{SD}/a", json=[{"op": "replace", "path": "/spec/replicas",
                                                  "value": 7}],
                               headers={"content-type": "application/json-patch+json"})
        assert r.status_code == 200 and r.json()["spec"]["replicas"] == 7
        r = await client.patch(f"{SD}/a", json={"spec": {"replicas": 1}}, headers={
            "content-type": "application/strategic-merge-patch+json"})
        assert r.status_code == 415  # as for a real CRD
        await apply(client, f"{DEP}/web", deployment("web"))
        r = await client.patch(f"{DEP}/web", json={"spec": {"replicas": 3}}, headers={
            "content-type": "application/strategic-merge-patch+json"})
        assert r.status_code == 200 and r.json()["spec"]["replicas"] == 3


# ------------------------------------------------------------------------- status, generation


async def test_status_subresource_isolation(api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        created = (await client.post(SD, json=sd("a") | {"status": {"phase": "Bogus"}})).json()
        assert "status" not in created  # status is ignored on create

        r = await client.patch(f"{SD}/a/status", json={"status": {"phase": "Ready"},
                                                        "spec": {"replicas": 9}}, headers=MERGE)
        assert r.status_code == 200
        assert r.json()["status"] == {"phase": "Ready"}
        assert r.json()["spec"]["replicas"] == 1
        assert r.json()["metadata"]["generation"] == 1

        obj = r.json()
        obj["status"] = {"phase": "Hacked"}
        obj["spec"]["replicas"] = 2
        r = await client.put(f"{SD}/a", json=obj)
        assert r.json()["status"] == {"phase": "Ready"}
        assert r.json()["spec"]["replicas"] == 2
        assert r.json()["metadata"]["generation"] == 2

        full = r.json()
        full["status"] = {"phase": "Degraded", "observedGeneration": 2}
        full["spec"]["replicas"] = 8
        r = await client.put(f"{SD}/a/status", json=full)
        assert r.json()["status"]["phase"] == "Degraded"
        assert r.json()["spec"]["replicas"] == 2

        status_apply = {"apiVersion": "platform.trio-supervisor.dev/v1",
                        "kind": "ServiceDefinition", "metadata": {"name": "a"},
                        "status": {"phase": "Ready"}, "spec": {"replicas": 99}}
        r = await apply(client, f"{SD}/a/status", status_apply, manager="status-writer")
        assert r.status_code == 409  # the PUT above (manager python-httpx) owns status.phase
        r = await apply(client, f"{SD}/a/status", status_apply, manager="status-writer",
                        force=True)
        assert r.status_code == 200, r.text
        assert r.json()["status"]["phase"] == "Ready"
        assert r.json()["spec"]["replicas"] == 2
        entries = [m for m in r.json()["metadata"]["managedFields"]
                   if m["manager"] == "status-writer"]
        assert entries[0]["subresource"] == "status"

        r = await apply(client, f"{SD}/missing/status", status_apply | {
            "metadata": {"name": "missing"}})
        assert r.status_code == 404


async def test_generation_bumps_only_on_spec_change(client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await client.post(SD, json=sd("a"))

        async def gen_rv() -> tuple[int, int]:
            obj = (await client.get(f"{SD}/a")).json()
            return obj["metadata"]["generation"], rv_of(obj)

        g0, rv0 = await gen_rv()
        await client.patch(f"{SD}/a", json={"metadata": {"labels": {"x": "y"}}}, headers=MERGE)
        g1, rv1 = await gen_rv()
        assert (g1, rv1 > rv0) == (g0, True)
        await client.patch(f"{SD}/a/status", json={"status": {"ok": True}}, headers=MERGE)
        g2, rv2 = await gen_rv()
        assert (g2, rv2 > rv1) == (g0, True)
        await client.patch(f"{SD}/a", json={"spec": {"replicas": 3}}, headers=MERGE)
        g3, _ = await gen_rv()
        assert g3 == g0 + 1
        # a patch that changes nothing is not a write
        r = await client.patch(f"{SD}/a", json={"spec": {"replicas": 3}}, headers=MERGE)
        g4, rv4 = await gen_rv()
        assert g4 == g3 and rv4 == rv_of(r.json())


# ------------------------------------------------------------------------- watches


async def test_watch_from_rv_sees_later_events_in_order(api: FakeApiServer,
                                                       client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        first = (await client.post(SD, json=sd("a"))).json()
        await client.post(SD, json=sd("b"))
        await client.patch(f"{SD}/a", json={"spec": {"replicas": 2}}, headers=MERGE)
        events: list[dict[str, Any]] = []

        async def watch() -> None:
            events.extend(await watch_events(client, SD, {"resourceVersion": str(rv_of(first))},
                                             count=3))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await api.wait_for_watches(1, "servicedefinitions")
            await client.delete(f"{SD}/b")
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
        rvs = [rv_of(e["object"]) for e in events]
        assert rvs == sorted(rvs) and rvs[0] > rv_of(first)
        assert events[0]["object"]["kind"] == "ServiceDefinition"
        # without a resourceVersion: the current state as ADDED first
        initial = await watch_events(client, SD, {}, count=1)
        assert initial[0]["type"] == "ADDED" and initial[0]["object"]["metadata"]["name"] == "a"


async def test_watch_bookmarks_and_timeout(api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        rv = api.resource_version
        events = await watch_events(client, DEP, {
            "resourceVersion": str(rv), "allowWatchBookmarks": "true", "timeoutSeconds": "1"})
        # the server ended the stream by itself after ~1 s, with bookmarks every 50 ms
        assert len(events) >= 3
        assert {e["type"] for e in events} == {"BOOKMARK"}
        assert events[0]["object"] == {"kind": "Deployment", "apiVersion": "apps/v1",
                                       "metadata": {"resourceVersion": str(rv)}}
        no_bookmarks = await watch_events(client, DEP, {"resourceVersion": str(rv),
                                                        "timeoutSeconds": "0"})
        assert no_bookmarks == []
        assert api.open_watches() == 0


async def test_watch_selector_transitions(api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        api.create({**sd("a"), "metadata": {"name": "a", "namespace": "trio-supervisor",
                                            "labels": {"team": "x"}}})
        rv = api.resource_version
        api.patch("servicedefinitions", "trio-supervisor", "a",
                  {"metadata": {"labels": {"team": "y"}}})
        api.patch("servicedefinitions", "trio-supervisor", "a",
                  {"metadata": {"labels": {"team": "x"}}})
        api.patch("servicedefinitions", "trio-supervisor", "a", {"spec": {"replicas": 2}})
        events = await watch_events(client, SD, {"resourceVersion": str(rv),
                                                 "labelSelector": "team=x"}, count=3)
        assert [e["type"] for e in events] == ["DELETED", "ADDED", "MODIFIED"]


async def test_compact_gives_410_error_event(api: FakeApiServer,
                                            client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        old = rv_of((await client.post(SD, json=sd("a"))).json())
        await client.post(SD, json=sd("b"))
        listed = (await client.get(SD, params={"limit": "1"})).json()
        current = api.compact()
        events = await watch_events(client, SD, {"resourceVersion": str(old)})
        assert len(events) == 1  # then the server ended the stream
        assert events[0]["type"] == "ERROR"
        status = events[0]["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
        # a watch from the current RV is fine
        await client.post(SD, json=sd("c"))
        ok = await watch_events(client, SD, {"resourceVersion": str(current)}, count=1)
        assert ok[0]["type"] == "ADDED" and ok[0]["object"]["metadata"]["name"] == "c"
        # and a continue token from before the compaction has expired
        r = await client.get(SD, params={"limit": "1", "continue": listed["metadata"]["continue"]})
        assert r.status_code == 410 and r.json()["reason"] == "Expired"
        r = await client.get(SD, params={"resourceVersion": str(old),
                                         "resourceVersionMatch": "Exact"})
        assert r.status_code == 410
        # a fresh list gives an RV a watch can start from
        fresh = (await client.get(SD)).json()["metadata"]["resourceVersion"]
        assert await watch_events(client, SD, {"resourceVersion": fresh,
                                               "timeoutSeconds": "0"}) == []


async def test_reset_state_lowers_the_rv_and_a_future_rv_is_too_large(
        api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await client.post(SD, json=sd("a"))
        old = api.resource_version
        async with trio.open_nursery() as nursery:
            ended: list[list[dict[str, Any]]] = []

            async def reader() -> None:
                ended.append(await watch_events(client, SD, {"resourceVersion": str(old)}))

            nursery.start_soon(reader)
            await api.wait_for_watches(1, "servicedefinitions")
            new = api.reset_state()
        # The open watch was ended, with no event for the wiped objects.
        assert ended == [[]]
        assert new < old
        assert api.get("servicedefinitions", "trio-supervisor", "a") is None
        assert api.get("namespaces", None, "apps") is not None  # re-created
        assert api.crd_installed("servicedefinitions")
        listed = (await client.get(SD)).json()
        assert listed["items"] == [] and listed["metadata"]["resourceVersion"] == str(new)

        # A watch from the old (now future) RV: after the wait, one ERROR event, then the end.
        api.too_large_rv_wait_s = 0.2
        start = trio.current_time()
        events = await watch_events(client, SD, {"resourceVersion": str(old)})
        assert trio.current_time() - start >= 0.19
        assert [e["type"] for e in events] == ["ERROR"]
        status = events[0]["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 504, "Timeout")
        assert status["message"] == f"Timeout: Too large resource version: {old}, current: {new}"
        assert status["details"]["causes"] == [{"reason": "ResourceVersionTooLarge",
                                                "message": "Too large resource version"}]
        # A list from it: the same Status, as an HTTP 504.
        r = await client.get(SD, params={"resourceVersion": str(old)})
        assert r.status_code == 504
        assert r.json()["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"

        # A future RV the server reaches within the wait is watched normally.
        api.too_large_rv_wait_s = 5.0
        target = api.resource_version + 1
        async with trio.open_nursery() as nursery:
            got: list[list[dict[str, Any]]] = []

            async def late_reader() -> None:
                got.append(await watch_events(client, SD, {"resourceVersion": str(target)},
                                              count=1))

            nursery.start_soon(late_reader)
            await api.wait_until(lambda: api.count("GET", SD, watch=True) >= 3)
            api.create({**sd("b"), "metadata": {"name": "b", "namespace": "trio-supervisor"}})
            api.create({**sd("c"), "metadata": {"name": "c", "namespace": "trio-supervisor"}})
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in got[0]] == [("ADDED", "c")]

        # Without the CRDs and with other namespaces.
        api.reset_state(keep_crds=False, namespaces=["elsewhere"])
        assert (await client.get(SD)).status_code == 404
        assert api.get("namespaces", None, "apps") is None
        assert api.get("namespaces", None, "elsewhere") is not None


async def test_history_window_expires_old_resource_versions() -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver(history_limit=3) as api:
            start = api.resource_version
            for i in range(5):
                api.create({**sd(f"s{i}"), "metadata": {"name": f"s{i}",
                                                        "namespace": "trio-supervisor"}})
            async with httpx.AsyncClient(base_url=api.url) as c:
                old = await watch_events(c, SD, {"resourceVersion": str(start)})
                assert [(e["type"], e["object"]["code"]) for e in old] == [("ERROR", 410)]
                recent = await watch_events(c, SD, {"resourceVersion": str(start + 2)},
                                            count=3)
                assert [e["object"]["metadata"]["name"] for e in recent] == ["s2", "s3", "s4"]


async def test_stalled_watch_sends_nothing(api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        rv = api.resource_version
        got: list[dict[str, Any]] = []
        arrived = trio.Event()
        headers_seen = trio.Event()

        async def reader(params: dict[str, str], sink: list[dict[str, Any]]) -> None:
            nonlocal arrived
            async with client.stream("GET", SD, params={"watch": "1", **params}) as resp:
                assert resp.status_code == 200  # the headers do arrive, even when stalled
                headers_seen.set()
                async for line in resp.aiter_lines():
                    sink.append(json.loads(line))
                    arrived.set()
                    arrived = trio.Event()

        async def wait_line(deadline: float) -> bool:
            """A client inactivity deadline: True if a line arrived within it."""
            with trio.move_on_after(deadline):
                await arrived.wait()
                return True
            return False

        async with trio.open_nursery() as nursery:
            # an open stream goes silent
            nursery.start_soon(reader, {"resourceVersion": str(rv),
                                        "allowWatchBookmarks": "true"}, got)
            assert await wait_line(5)
            assert got[0]["type"] == "BOOKMARK"
            api.stall_watches()
            seen = len(got)
            await client.post(SD, json=sd("a"))
            assert not await wait_line(0.3)  # six bookmark periods, not a line
            assert len(got) == seen
            # a new stream hangs after its headers, past its own timeoutSeconds
            late: list[dict[str, Any]] = []
            headers_seen = trio.Event()
            nursery.start_soon(reader, {"resourceVersion": str(rv), "timeoutSeconds": "0.05"},
                               late)
            await headers_seen.wait()
            assert not await wait_line(0.2)
            assert late == []
            api.unstall_watches()
            await api.wait_until(lambda: any(e["type"] == "ADDED" for e in got) and bool(late))
            assert [e["type"] for e in late] == ["ADDED"]  # then its timeout ended it
            api.close_watches()
        assert [e["object"]["metadata"]["name"] for e in got if e["type"] == "ADDED"] == ["a"]


async def test_close_watches_and_client_disconnect(api: FakeApiServer,
                                                   client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        ended = trio.Event()

        async def watch() -> None:
            await watch_events(client, SD, {"resourceVersion": str(api.resource_version)})
            ended.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await api.wait_for_watches(1)
            api.close_watches()
            await ended.wait()
        assert api.open_watches() == 0

        async with client.stream("GET", SD, params={"watch": "1"}):
            await api.wait_for_watches(1)
        await api.wait_until(lambda: api.open_watches() == 0)
        # a client giving up on a stalled stream frees it too
        api.stall_watches()
        async with client.stream("GET", SD, params={"watch": "1"}):
            await api.wait_for_watches(1)
        await api.wait_until(lambda: api.open_watches() == 0)


async def test_schema_skewed_object_and_raw_watch_lines(api: FakeApiServer,
                                                       client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        rv = api.resource_version
        raw = sd("skewed")
        raw["metadata"]["namespace"] = "trio-supervisor"
        raw["spec"]["replicas"] = "three"
        stored = api.put_raw(raw)
        assert stored["spec"]["replicas"] == "three" and rv_of(stored) == rv + 1
        listed = (await client.get(SD)).json()["items"]
        assert listed[0]["spec"]["replicas"] == "three"
        lines: list[bytes] = []
        async with client.stream("GET", SD, params={"watch": "1", "resourceVersion": str(rv)},
                                 ) as resp:
            stream = resp.aiter_lines()
            lines.append((await anext(stream)).encode())
            assert api.inject_watch_line(b'{"type": "MODIFIED", "object": {bro', ) == 1
            lines.append((await anext(stream)).encode())
        assert json.loads(lines[0])["object"]["spec"]["replicas"] == "three"
        assert lines[1] == b'{"type": "MODIFIED", "object": {bro'


# ------------------------------------------------------------------------- auth, faults


async def test_token_auth_and_rotation() -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver(token="one") as api:
            async with httpx.AsyncClient(base_url=api.url) as c:
                r = await c.get(SD)
                assert r.status_code == 401
                assert r.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Failure", "message": "Unauthorized",
                                    "reason": "Unauthorized", "code": 401}
                ok = await c.get(SD, headers={"Authorization": "Bearer one"})
                assert ok.status_code == 200
                api.set_token("two")
                assert (await c.get(SD, headers={"Authorization": "Bearer one"})
                        ).status_code == 401
                assert (await c.get(SD, headers={"Authorization": "Bearer two"})
                        ).status_code == 200
                assert api.count("GET", "servicedefinitions", status=401) == 2


async def test_injected_faults(api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        api.inject("GET", r"/servicedefinitions$", status=429, headers={"Retry-After": "3"})
        r = await client.get(SD)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "3"
        assert r.json()["reason"] == "TooManyRequests"
        assert (await client.get(SD)).status_code == 200  # times=1

        api.inject("*", "deployments", status=429, times=2)
        assert (await client.get(DEP)).headers["retry-after"] == "1"
        assert (await client.get(DEP)).status_code == 429
        assert (await client.get(DEP)).status_code == 200

        api.inject("PATCH", "servicedefinitions", status=403)
        r = await apply(client, f"{SD}/a", sd("a"))
        assert r.status_code == 403 and r.json()["reason"] == "Forbidden"

        api.inject("GET", "servicedefinitions", status=500, body={"weird": True})
        r = await client.get(SD)
        assert r.status_code == 500 and r.json() == {"weird": True}

        api.inject("GET", "servicedefinitions", status=200, body=b"{not json")
        r = await client.get(SD)
        assert r.status_code == 200 and r.content == b"{not json"

        api.inject("GET", "servicedefinitions", status=200, query_contains="watch=1",
                   body={"items": "skewed"})
        assert "items" in (await client.get(SD)).json()  # a list is untouched
        r = await client.get(SD, params={"watch": "1"})
        assert r.json() == {"items": "skewed"}

        api.inject("GET", "servicedefinitions", status=401)
        assert (await client.get(SD)).status_code == 401
        injected = [r for r in api.requests if r.injected]
        assert len(injected) == 8

        api.inject("GET", "workflows", status=200, hang=True)
        with trio.move_on_after(0.2) as waited:
            await client.get(WF)
        assert waited.cancelled_caught
        api.clear_injections()
        assert (await client.get(WF)).status_code == 200


async def test_rbac_denial(api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        rule = api.deny("patch", "deployments", namespace="apps")
        r = await apply(client, f"{DEP}/web", deployment("web"))
        assert r.status_code == 403
        assert r.json()["message"] == (
            'deployments.apps "web" is forbidden: User '
            '"system:serviceaccount:trio-supervisor:trio-supervisor" cannot patch resource '
            '"deployments" in API group "apps" in the namespace "apps"')
        assert (await client.get(DEP)).status_code == 200
        api.deny("list", "servicedefinitions")
        assert (await client.get(SD)).status_code == 403
        api.deny("update", "servicedefinitions/status")
        await client.post(SD, json=sd("a"))
        obj = (await client.get(f"{SD}/a")).json()
        assert (await client.put(f"{SD}/a/status", json=obj)).status_code == 403
        assert (await client.put(f"{SD}/a", json=obj)).status_code == 200
        api.allow(rule)
        assert (await apply(client, f"{DEP}/web", deployment("web"))).status_code == 201
        api.allow()
        assert (await client.get(SD)).status_code == 200


async def test_uninstall_crd(api: FakeApiServer, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await client.post(SD, json=sd("a"))
        api.uninstall_crd("servicedefinitions", keep_objects=True)
        r = await client.get(SD)
        assert r.status_code == 404
        assert r.json()["kind"] == "Status" and r.json()["reason"] == "NotFound"
        assert (await client.post(SD, json=sd("b"))).status_code == 404
        resources = (await client.get("/apis/platform.trio-supervisor.dev/v1")).json()
        assert "servicedefinitions" not in [x["name"] for x in resources["resources"]]
        assert (await client.get(WF)).status_code == 200
        api.install_crd("servicedefinitions")
        assert [i["metadata"]["name"] for i in (await client.get(SD)).json()["items"]] == ["a"]
        events: list[dict[str, Any]] = []

        async def watch() -> None:
            events.extend(await watch_events(client, SD, {
                "resourceVersion": str(api.resource_version)}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await api.wait_for_watches(1, "servicedefinitions")
            api.uninstall_crd("servicedefinitions")
        # its objects were deleted, watchers saw that, then their streams ended
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("DELETED", "a")]
        api.install_crd("servicedefinitions")
        assert (await client.get(SD)).json()["items"] == []

        async with run_fake_apiserver(crds_installed=False) as bare:
            async with httpx.AsyncClient(base_url=bare.url) as c:
                assert (await c.get(SD)).status_code == 404
                assert (await c.get("/apis/platform.trio-supervisor.dev/v1")).status_code == 404
                assert (await c.get(DEP)).status_code == 200


async def test_discovery_and_version(client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        groups = (await client.get("/apis")).json()
        assert "platform.trio-supervisor.dev" in [g["name"] for g in groups["groups"]]
        core = (await client.get("/api/v1")).json()
        assert {"namespaces", "services", "services/status"} <= {
            r["name"] for r in core["resources"]}
        assert (await client.get("/version")).json()["major"] == "1"


async def test_direct_state_api_and_wait_until(api: FakeApiServer,
                                               client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        with pytest.raises(ApiError) as err:
            api.create({**sd("a"), "metadata": {"name": "a", "namespace": "ghost"}})
        assert err.value.code == 404

        async def later() -> None:
            await client.post(SD, json=sd("a"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(later)
            await api.wait_until(lambda: api.get("servicedefinitions", "trio-supervisor", "a")
                                 is not None)
        api.apply(deployment("web"), field_manager="sup")
        dep = api.set_status("deployments", "apps", "web", {"readyReplicas": 1})
        assert dep["status"] == {"readyReplicas": 1}
        assert dep["metadata"]["generation"] == 1
        assert api.delete("deployments", "apps", "web") is not None
        assert api.delete("deployments", "apps", "web") is None
        assert api.count("POST") == 1 and len(api.writes("servicedefinitions")) == 1


# ------------------------------------------------------------------------- kubeconfig, process


async def test_kubeconfig_is_accepted_by_the_kubernetes_package(api: FakeApiServer,
                                                               tmp_path: Path) -> None:
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    api.set_token("secret")
    path = tmp_path / "kubeconfig"
    write_kubeconfig(api, path)
    cfg = kclient.Configuration()
    kconfig.load_kube_config(config_file=str(path), client_configuration=cfg)  # type: ignore[no-untyped-call]
    assert cfg.host == api.url
    assert cfg.api_key["BearerToken"].lower() == "bearer secret"

    token_file = tmp_path / "token"
    # NB: load_kube_config keeps a trailing newline of a tokenFile: strip it when you read one
    token_file.write_text("from-file")
    write_kubeconfig(api, path, token_file=str(token_file))
    cfg = kclient.Configuration()
    kconfig.load_kube_config(config_file=str(path), client_configuration=cfg)  # type: ignore[no-untyped-call]
    assert cfg.api_key["BearerToken"].lower() == "bearer from-file"


async def test_process_mode(tmp_path: Path) -> None:
    with trio.fail_after(30):
        ready = tmp_path / "ready"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tests.fakes.apiserver", "--port", "0", "--ready-file",
             str(ready), "--token", "tok", "--bookmark-interval", "0.05"],
            cwd=str(REPO), env=env, stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            buf = b""
            while not buf.endswith(b"\n"):  # the URL is printed once listening
                chunk = await proc.stdout.receive_some(1024)
                assert chunk, "process exited before it was ready"
                buf += chunk
            url = ready.read_text().strip()
            assert url == buf.decode().strip() and url.startswith("http://127.0.0.1:")

            control = FakeControl(url, token="tok")
            await control.create(sd("a") | {"metadata": {"name": "a",
                                                         "namespace": "trio-supervisor"}})
            async with httpx.AsyncClient(base_url=url,
                                         headers={"Authorization": "Bearer tok"}) as c:
                r = await c.get(SD)
                assert [i["metadata"]["name"] for i in r.json()["items"]] == ["a"]
                r = await apply(c, f"{DEP}/web", deployment("web"))
                assert r.status_code == 201
            deps = await control.objects("deployments", "apps")
            assert [d["metadata"]["name"] for d in deps] == ["web"]
            await control.uninstall_crd("servicedefinitions")
            await control.inject("GET", "deployments", status=429)
            await control.compact()
            before = int((await control.state())["resourceVersion"])
            assert await control.reset_state(namespaces=["apps"]) < before
            assert await control.objects("deployments", "apps") == []
            await control.stall_watches()
            await control.unstall_watches()
            async with httpx.AsyncClient(base_url=url,
                                         headers={"Authorization": "Bearer tok"}) as c:
                assert (await c.get(SD)).status_code == 404
                assert (await c.get(DEP)).status_code == 429
            requests = await control.requests()
            assert any(r["status"] == 429 for r in requests)
            state = await control.state()
            assert state["url"] == url

            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_put_raw_keeps_the_field_owners_an_object_was_stored_with() -> None:
    # A store restored from what another one returned (as etcd keeps managedFields):
    # who wrote what survives, so an apply conflicts with the same managers as before.
    with trio.fail_after(10):
        async with run_fake_apiserver() as old, run_fake_apiserver() as new:
            old.create(deployment("web", replicas=2), field_manager="team")
            old.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": {"name": "web", "namespace": "apps"},
                       "spec": {"replicas": 3}}, field_manager="scaler", force=True)
            stored = old.get("deployments", "apps", "web")
            assert stored is not None
            restored = new.put_raw({k: v for k, v in stored.items()})
            assert restored["metadata"]["managedFields"] == stored["metadata"]["managedFields"]
