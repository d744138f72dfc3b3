"""The fan-out reconcilers against the fake API server, over real HTTP on loopback.

Every test runs a :class:`~supervisor.fanout.engine.FanoutEngine` with a
:class:`~supervisor.kube.client.KubeClient` configured from a kubeconfig that
points at the fake (never a patched client), and observes the fake's state
and its request log. Timings are shrunk (bookmarks every 0.2 s, inactivity
deadline 1 s) and every test runs under ``trio.fail_after``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import trio
from structlog.testing import capture_logs

from supervisor import reasons
from supervisor.fanout.engine import FanoutEngine
from supervisor.fanout.labels import INSTALLATION_KEY, LINEAGE_SERVICEDEFINITION, LINEAGE_WORKFLOW
from supervisor.fanout.servicedefinition import SERVICE_DEFINITION
from supervisor.fanout.status import FanoutStatus
from supervisor.fanout.workflow import WORKFLOW
from supervisor.kube.applying import ChildKey
from supervisor.telemetry import Metrics
from tests.fakes.apiserver import FakeApiServer
from tests.fanout import (
    APPS,
    CONTROL,
    FAST,
    container,
    harness,
    ready,
    sd,
    wf,
)


async def test_servicedefinition_create_update_delete_reflected_in_children(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await h.until(lambda: h.status.state == "watching")
            fake.create(sd("web", port=8080, env={"B": "2", "A": "1"}, replicas=2))
            await h.until(lambda: fake.get("services", APPS, "web") is not None
                          and ready(fake.get("servicedefinitions", CONTROL, "web")) is not None)

            deployment = fake.get("deployments", APPS, "web")
            assert deployment is not None
            labels = deployment["metadata"]["labels"]
            assert labels == {
                "app.kubernetes.io/name": "web",
                "app.kubernetes.io/managed-by": "trio-supervisor",
                "platform.trio-supervisor.dev/installation": CONTROL,
                LINEAGE_SERVICEDEFINITION: "web",
            }
            assert deployment["spec"]["replicas"] == 2
            assert container(deployment)["image"] == "nginx:1.27"
            assert container(deployment)["env"] == [{"name": "A", "value": "1"},
                                                    {"name": "B", "value": "2"}]
            service = fake.get("services", APPS, "web")
            assert service is not None
            assert service["spec"]["ports"][0]["port"] == 8080
            assert service["metadata"]["labels"] == labels
            parent = fake.get("servicedefinitions", CONTROL, "web")
            assert parent is not None
            assert parent["status"]["observedGeneration"] == 1
            assert ready(parent) is not None and ready(parent)["status"] == "True"  # type: ignore[index]
            assert ready(parent)["reason"] == "Applied"  # type: ignore[index]
            # Each child was created (never applied over whatever held its name), the
            # status server-side applied, all by our field manager.
            creates = fake.find_requests("POST", f"/namespaces/{APPS}/")
            assert len(creates) == 2 and all(r.field_manager == "trio-supervisor"
                                             for r in creates)
            patches = fake.find_requests("PATCH")
            assert patches and all(r.content_type == "application/apply-patch+yaml"
                                   and r.field_manager == "trio-supervisor" for r in patches)
            assert h.status.objects == 1
            assert h.metric("fanout_objects", kind="ServiceDefinition") == 1

            # Update: new image, no port -> the Service goes.
            fake.patch("servicedefinitions", CONTROL, "web",
                       {"spec": {"image": "nginx:1.28", "port": None}})
            await h.until(lambda: fake.get("services", APPS, "web") is None)
            await h.until(lambda: container(fake.get("deployments", APPS, "web") or {
                "spec": {"template": {"spec": {"containers": [{}]}}}}).get("image")
                == "nginx:1.28")
            await h.until(lambda: (fake.get("servicedefinitions", CONTROL, "web") or {})
                          .get("status", {}).get("observedGeneration") == 2)

            # Delete: the children go.
            fake.delete("servicedefinitions", CONTROL, "web")
            await h.until(lambda: fake.get("deployments", APPS, "web") is None)
            await h.until(lambda: h.status.objects == 0)
            await h.idle()
            assert h.metric("fanout_applies", kind="ServiceDefinition", result="deleted") >= 2


async def test_workflow_create_update_delete_reflected_in_cronjob(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path, kind=WORKFLOW) as h:
            fake = h.fake
            fake.create(wf("nightly", args=["--all"]))
            await h.until(lambda: fake.get("cronjobs", APPS, "nightly") is not None)
            cron = fake.get("cronjobs", APPS, "nightly")
            assert cron is not None
            assert cron["spec"]["schedule"] == "*/5 * * * *"
            assert cron["metadata"]["labels"][LINEAGE_WORKFLOW] == "nightly"
            pod = cron["spec"]["jobTemplate"]["spec"]["template"]
            assert pod["spec"]["containers"][0]["args"] == ["--all"]
            assert pod["metadata"]["labels"][LINEAGE_WORKFLOW] == "nightly"

            fake.patch("workflows", CONTROL, "nightly", {"spec": {"schedule": "0 3 * * *"}})
            await h.until(lambda: (fake.get("cronjobs", APPS, "nightly") or {})
                          .get("spec", {}).get("schedule") == "0 3 * * *")
            fake.delete("workflows", CONTROL, "nightly")
            await h.until(lambda: fake.get("cronjobs", APPS, "nightly") is None)


async def test_an_unchanged_resync_makes_no_write(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            for i in range(5):
                fake.create(sd(f"svc-{i}", port=80 + i))
            await h.until(lambda: all(ready(fake.get("servicedefinitions", CONTROL, f"svc-{i}"))
                                      for i in range(5)))
            await h.idle()
            before = len(h.fake.requests)
            await h.reconciler.resync()
            await h.idle()
            after = fake.requests[before:]
            assert [r for r in after if r.method != "GET"] == []
            assert h.reconciler.resyncs == 2
            assert h.metric("fanout_applies", kind="ServiceDefinition", result="unchanged") >= 10


async def test_a_restarted_reconciler_writes_nothing_for_up_to_date_children(
    tmp_path: Path,
) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            h.fake.create(sd("web", port=8080))
            await h.until(lambda: ready(h.fake.get("servicedefinitions", CONTROL, "web")))
            await h.idle()
            fake = h.fake
            # A second reconciler (a restart) against the same server.
            before = len(fake.requests)
            second = FanoutEngine(h.client, SERVICE_DEFINITION, h.reconciler.config,
                                Metrics(process=False), FanoutStatus(), FAST)
            async with trio.open_nursery() as nursery:
                await nursery.start(second.run)
                await second.synced.wait()
                await second.queue.wait_idle()
                nursery.cancel_scope.cancel()
            assert [r for r in fake.requests[before:] if r.method != "GET"] == []


def _orphan_deployment(name: str, installation: str | None = CONTROL) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "trio-supervisor",
              LINEAGE_SERVICEDEFINITION: name}
    if installation is not None:
        labels[INSTALLATION_KEY] = installation
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": APPS, "labels": labels},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }


async def test_an_orphan_is_swept_and_foreign_objects_are_left_alone(tmp_path: Path) -> None:
    def seed(fake: FakeApiServer) -> None:
        fake.create(_orphan_deployment("gone"), field_manager="trio-supervisor")
        # Another installation sharing the apps namespace: its children are not ours.
        fake.create(_orphan_deployment("other-install", installation="staging"))
        fake.create({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "theirs", "namespace": APPS, "labels": {"app": "theirs"}},
            "spec": {"selector": {"matchLabels": {"app": "theirs"}},
                     "template": {"metadata": {"labels": {"app": "theirs"}},
                                  "spec": {"containers": [{"name": "c", "image": "x"}]}}},
        })

    with trio.fail_after(10):
        async with harness(tmp_path, before_start=seed) as h:
            await h.until(lambda: h.fake.get("deployments", APPS, "gone") is None)
            assert h.fake.get("deployments", APPS, "theirs") is not None
            assert h.fake.get("deployments", APPS, "other-install") is not None
            # Every child list and watch selected on our installation, or (the watch of
            # the names other installations hold, never written) on any other one.
            child_reads = [r for r in h.fake.find_requests("GET", "/deployments")
                           if r.query.get("limit") != "1"]
            selectors = {r.query.get("labelSelector", "") for r in child_reads}
            assert selectors == {
                f"app.kubernetes.io/managed-by=trio-supervisor,{INSTALLATION_KEY}={CONTROL},"
                f"{LINEAGE_SERVICEDEFINITION}",
                f"app.kubernetes.io/managed-by=trio-supervisor,{LINEAGE_SERVICEDEFINITION},"
                f"{INSTALLATION_KEY},{INSTALLATION_KEY}!={CONTROL}",
            }
            # An orphan made while running is swept by the periodic resync.
            h.fake.create({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "late", "namespace": APPS, "labels": {
                    "app.kubernetes.io/managed-by": "trio-supervisor",
                    INSTALLATION_KEY: CONTROL,
                    LINEAGE_SERVICEDEFINITION: "late"}},
                "spec": {"ports": [{"port": 80}]},
            }, field_manager="trio-supervisor")
            await h.until(lambda: h.reconciler.live.get(ChildKey("services", "late")) is not None)
            await h.reconciler.resync()
            assert h.fake.get("services", APPS, "late") is None
            assert h.fake.get("deployments", APPS, "other-install") is not None


async def test_a_410_relists(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("a"))
            await h.until(lambda: fake.get("deployments", APPS, "a") is not None)
            informer = h.reconciler.informer
            assert informer is not None and informer.lists == 1
            fake.compact()
            fake.close_watches()  # the re-watch from the old RV now gets ERROR 410
            fake.create(sd("b"))
            await h.until(lambda: fake.get("deployments", APPS, "b") is not None)
            await h.until(lambda: informer.lists == 2)
            assert h.metric("fanout_watch_restarts", kind="ServiceDefinition") >= 1


async def test_a_skewed_object_mid_stream_is_skipped(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("good", port=80))
            await h.until(lambda: fake.get("services", APPS, "good") is not None)
            with capture_logs() as logs:
                # The stored object now has a type our schema does not read.
                bad = sd("good", port=80)
                bad["spec"]["replicas"] = "three"
                fake.put_raw(bad)
                fake.create(sd("after"))
                await h.until(lambda: fake.get("deployments", APPS, "after") is not None)
            skew = [e for e in logs if e.get("error_class") == reasons.SCHEMA_SKEW]
            assert skew and skew[0]["log_level"] == "error"
            assert skew[0]["kind"] == "ServiceDefinition" and skew[0]["name"] == "good"
            assert "kubectl apply -k manifests/crds" in skew[0]["detail"]
            assert h.status.last_error_class == reasons.SCHEMA_SKEW
            assert h.status.state == "watching"
            # The unreadable parent's children are left alone, also by a resync.
            await h.reconciler.resync()
            assert fake.get("services", APPS, "good") is not None
            assert h.status.objects == 2


async def test_a_stalled_stream_is_detected(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await fake.wait_for_watches(1, "servicedefinitions")
            with capture_logs() as logs:
                fake.stall_watches()
                await h.until(lambda: h.metric("fanout_watch_restarts",
                                               kind="ServiceDefinition") >= 1)
                fake.unstall_watches()
            assert any("nothing received" in str(e.get("error", "")) for e in logs)
            fake.create(sd("after-stall"))
            await h.until(lambda: fake.get("deployments", APPS, "after-stall") is not None)


async def test_a_401_re_reads_the_rotated_token_and_the_watch_goes_on(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one")
    with trio.fail_after(10):
        async with harness(tmp_path, token="one", token_file=token) as h:
            fake = h.fake
            fake.create(sd("a"))
            await h.until(lambda: fake.get("deployments", APPS, "a") is not None)
            token.write_text("two")
            fake.set_token("two")
            fake.close_watches()  # the re-watch meets the rotated token
            await h.until(lambda: fake.count(status=401) >= 1)
            fake.create(sd("b"))
            await h.until(lambda: fake.get("deployments", APPS, "b") is not None)
            assert h.client.token_reloads == 1
            # Every re-watch opens again (each kind's watches re-open one by one).
            await h.until(lambda: h.status.state == "watching")
            assert h.client.token_reloads == 1


async def test_a_409_is_requeued_and_retried(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.inject("POST", r"/deployments/web$", status=409, times=2)
            fake.create(sd("web"))
            await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
            await h.until(lambda: (ready(fake.get("servicedefinitions", CONTROL, "web")) or {})
                          .get("reason") == "Applied")
            assert fake.count("POST", "/deployments/web", status=409) == 2
            assert h.metric("fanout_applies", kind="ServiceDefinition", result="conflict") == 2
            reasons_written = [
                r.body["status"]["conditions"][0]["reason"]
                for r in fake.find_requests("PATCH", "/servicedefinitions/web/status")
            ]
            assert reasons_written[0] == "Conflict" and reasons_written[-1] == "Applied"


async def test_an_invalid_child_sets_ready_false_without_a_retry_loop(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path, kind=WORKFLOW) as h:
            fake = h.fake
            fake.create(wf("bad", schedule="every day"))
            await h.until(lambda: (ready(fake.get("workflows", CONTROL, "bad")) or {})
                          .get("reason") == "Invalid")
            cond = ready(fake.get("workflows", CONTROL, "bad"))
            assert cond is not None and cond["status"] == "False"
            assert "schedule" in cond["message"]
            # Settled: nothing queued and no requeue pending, after exactly one attempt
            # (our own status write's MODIFIED event did not resend the refused child).
            await h.idle()
            assert fake.count("POST", "/cronjobs/bad") == 1


async def test_a_429_honours_retry_after(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await fake.wait_for_watches(1, "servicedefinitions")
            fake.inject("GET", r"/servicedefinitions$", status=429, query_contains="watch=",
                        headers={"Retry-After": "1"})
            fake.close_watches()
            await h.until(lambda: fake.count("GET", "/servicedefinitions", watch=True,
                                             status=200) >= 2)
            throttled = fake.find_requests("GET", "/servicedefinitions", status=429)[0]
            after = [r for r in fake.find_requests("GET", "/servicedefinitions", watch=True)
                     if r.time > throttled.time]
            assert after[0].time - throttled.time >= 0.95


async def test_an_undecodable_watch_line_restarts_the_watch(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await fake.wait_for_watches(1, "servicedefinitions")
            fake.inject_watch_line(b"{this is not json", "servicedefinitions")
            await h.until(lambda: h.metric("fanout_watch_restarts",
                                           kind="ServiceDefinition") >= 1)
            fake.create(sd("later"))
            await h.until(lambda: fake.get("deployments", APPS, "later") is not None)
            assert h.status.state == "watching"


async def test_a_missing_namespace_retries_quietly_while_a_skewed_crd_logs_an_error(
    tmp_path: Path,
) -> None:
    # The apps namespace (and so its Role) is not there yet: listing there is forbidden.
    def unprovisioned(fake: FakeApiServer) -> None:
        fake.deny("list", "deployments", APPS)

    with trio.fail_after(10), capture_logs() as logs:
        async with harness(tmp_path, namespaces=(CONTROL,),
                           before_start=unprovisioned) as h:
            fake = h.fake
            await h.until(lambda: fake.count("GET", "/deployments", status=403) >= 2)
            assert h.status.state == "preflight"
            assert h.status.last_error_class == reasons.NAMESPACE_OR_RBAC_UNREADY
            # "kubectl apply -k manifests/apps-namespace"
            fake.create_namespace(APPS)
            fake.allow()
            await h.until(lambda: h.status.report().state == "watching")
            assert h.status.last_error_class is None
    unready = [e for e in logs if e.get("error_class") == reasons.NAMESPACE_OR_RBAC_UNREADY]
    assert len(unready) >= 2
    assert {e["log_level"] for e in unready} == {"warning"}
    assert all(e["kind"] == "ServiceDefinition" for e in unready)
    assert "manifests/apps-namespace" in unready[0]["detail"]
    assert not [e for e in logs if e["log_level"] == "error"]


async def test_one_undecodable_parent_that_sorts_first_never_blocks_its_kind(
    tmp_path: Path,
) -> None:
    # A preflight that decoded a one-item list with the typed decoder would let one bad
    # object that sorts first hold the whole kind in the preflight.
    def skewed_object(fake: FakeApiServer) -> None:
        bad = sd("aaa-old")
        bad["spec"] = {"image": ["an", "array"], "replicas": "two"}  # an older schema
        fake.put_raw(bad)
        fake.create(sd("web"))

    with trio.fail_after(10), capture_logs() as logs:
        async with harness(tmp_path, before_start=skewed_object) as h:
            fake = h.fake
            await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
            # Every watch open (the children's may open after the first write).
            await h.until(lambda: h.status.state == "watching")
            assert h.status.last_error_class == reasons.SCHEMA_SKEW
            assert h.status.report().skewed == ["aaa-old"]
            assert h.metric("fanout_preflight_failures", kind="ServiceDefinition",
                            error_class=reasons.SCHEMA_SKEW) == 0
            # A parent created later is fanned out too: the kind is watching.
            fake.create(sd("api"))
            await h.until(lambda: fake.get("deployments", APPS, "api") is not None)
            assert fake.get("deployments", APPS, "aaa-old") is None
            fake.put_raw(sd("aaa-old"))  # the object was fixed
            await h.until(lambda: fake.get("deployments", APPS, "aaa-old") is not None)
            assert h.status.last_error_class is None
            assert h.status.report().skewed is msgspec.UNSET
    skew = [e for e in logs if e.get("error_class") == reasons.SCHEMA_SKEW]
    assert len(skew) == 1  # named once, not on every retry
    line = skew[0]
    assert line["log_level"] == "error"
    assert (line["kind"], line["name"]) == ("ServiceDefinition", "aaa-old")
    assert line["path"].startswith("$.spec.")
    assert "kubectl apply -k manifests/crds" in line["detail"]


async def test_a_crd_removed_while_watching_sends_the_watcher_back_to_preflight(
    tmp_path: Path,
) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("kept"))
            await h.until(lambda: fake.get("deployments", APPS, "kept") is not None)
            await h.until(lambda: h.status.state == "watching")
            fake.uninstall_crd("servicedefinitions", keep_objects=True)
            # preflight as soon as the watch ends; the re-watch's 404 then names why.
            await h.until(lambda: h.status.state == "preflight"
                          and h.status.last_error_class == reasons.NAMESPACE_OR_RBAC_UNREADY)
            await h.until(lambda: fake.count("GET", "/servicedefinitions", status=404) >= 2)
            fake.install_crd("servicedefinitions")
            await h.until(lambda: h.status.state == "watching")
            fake.create(sd("new"))
            await h.until(lambda: fake.get("deployments", APPS, "new") is not None)
            assert fake.get("deployments", APPS, "kept") is not None
