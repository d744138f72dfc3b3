"""The fan-out keeps what it owns apart and in order, against the fake API server.

A replayed watch event older than the stream never rolls a parent back; a
parent name at the 253-character limit still gets its events; a child of
another installation with the same name, and two kinds with a parent of the
same name, keep apart; a child held by a finalizer is not deleted again;
status writes failing with 500, the apps namespace deleted and made again,
and a lineage label edited by hand (repaired, not deleted) are survived. What a
real server can show is in tests/integration/test_realkube_faults.py.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import trio
from structlog.testing import capture_logs

from supervisor.fanout.labels import INSTALLATION_KEY, LINEAGE_SERVICEDEFINITION
from supervisor.fanout.workflow import WORKFLOW
from tests.fakes.apiserver import FakeApiServer
from tests.fanout import (
    APPS,
    CONTROL,
    FAST,
    _ours,
    child_writes,
    container,
    events,
    harness,
    ready,
    sd,
    wf,
)


async def test_a_watch_event_older_than_what_is_held_does_not_roll_a_parent_back(
    tmp_path: Path,
) -> None:
    # A watch (a caching proxy, a misbehaving server) delivers a parent's event
    # whose resourceVersion is lower than the one already held. Applying it would roll the
    # children back to a spec the parent no longer has, and nothing would ever fix them.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("web", image="nginx:1.27"))
            await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
            old = fake.get("servicedefinitions", CONTROL, "web")
            fake.patch("servicedefinitions", CONTROL, "web", {"spec": {"image": "nginx:1.28"}})
            await h.until(lambda: container(fake.get("deployments", APPS, "web"))["image"]
                          == "nginx:1.28")
            await h.idle()
            before = len(child_writes(fake))
            line = json.dumps({"type": "MODIFIED", "object": old}).encode()
            with capture_logs() as logs:
                assert fake.inject_watch_line(line, "servicedefinitions") == 1
                fake.create(sd("after"))  # a later event: the stale one has been read by then
                await h.until(lambda: fake.get("deployments", APPS, "after") is not None)
                await h.idle()
            assert container(fake.get("deployments", APPS, "web"))["image"] == "nginx:1.28"
            assert h.reconciler.parents["web"].spec.image == "nginx:1.28"
            assert [(w.method, w.target) for w in child_writes(fake)[before:]] == [
                ("POST", f"/apis/apps/v1/namespaces/{APPS}/deployments/after")]
            ignored = [e for e in logs if e["event"].startswith("watch event not newer")]
            assert len(ignored) == 1 and ignored[0]["log_level"] == "warning"
            assert ignored[0]["event_resource_version"] == old["metadata"]["resourceVersion"]


async def test_a_parent_named_at_the_253_character_limit_still_gets_its_events(
    tmp_path: Path,
) -> None:
    # A parent's name may be 253 characters, but a label value only 63, so its
    # child is refused (Invalid, reported). The Event saying so was named "<parent>.<hex>"
    # (270 characters), refused too, and dropped with a hint at RBAC.
    long = "a" * 253
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            with capture_logs() as logs:
                fake.create(sd(long))
                await h.until(lambda: (ready(fake.get("servicedefinitions", CONTROL, long))
                                       or {}).get("reason") == "Invalid")
                await h.idle()
            assert "63 characters" in ready(fake.get("servicedefinitions", CONTROL, long))[
                "message"]
            (event,) = events(fake, "Invalid", long)
            assert event["type"] == "Warning" and len(event["metadata"]["name"]) <= 253
            assert event["metadata"]["name"].startswith("a" * 200)
            assert not [e for e in logs if "could not record" in e["event"]]


async def test_a_child_of_another_installation_with_the_same_name_is_not_taken_over(
    tmp_path: Path,
) -> None:
    # Two installations share the apps namespace and each has a parent "web".
    # The second one force-applied over the first one's Deployment (relabelling it as its
    # own), the first one repaired it back, and so on: a fight over a child that was never
    # the second one's. It must leave a child of another installation alone and say so.
    from supervisor.config import KubernetesConfig
    from supervisor.fanout.engine import FanoutEngine
    from supervisor.fanout.servicedefinition import SERVICE_DEFINITION
    from supervisor.fanout.status import FanoutStatus
    from supervisor.kube.client import KubeClient
    from supervisor.telemetry import Metrics

    with trio.fail_after(15):
        async with harness(tmp_path, namespaces=(CONTROL, APPS, "team-b")) as h:
            fake = h.fake
            fake.create(sd("web", image="nginx:1.27"))
            await h.until(lambda: ready(fake.get("servicedefinitions", CONTROL, "web")))
            await h.idle()
            other = KubeClient.from_kubeconfig(str(tmp_path / "kubeconfig"))
            config = KubernetesConfig(enabled=True, kubeconfig=str(tmp_path / "kubeconfig"),
                                      control_namespace="team-b", installation="team-b")
            engine_b = FanoutEngine(other, SERVICE_DEFINITION, config, Metrics(process=False),
                                    FanoutStatus(), FAST)
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(engine_b.run)
                    await engine_b.synced.wait()
                    before = len(fake.requests)
                    theirs = sd("web", image="httpd:2.4")
                    theirs["metadata"]["namespace"] = "team-b"
                    fake.create(theirs)
                    await h.until(lambda: ready(fake.get("servicedefinitions", "team-b", "web")))
                    await engine_b.queue.wait_idle()
                    await engine_b.resync()
                    await engine_b.queue.wait_idle()
                    await h.idle()
                    deployment = fake.get("deployments", APPS, "web")
                    assert deployment["metadata"]["labels"][INSTALLATION_KEY] == CONTROL
                    assert container(deployment)["image"] == "nginx:1.27"
                    assert not [r for r in fake.requests[before:]
                                if r.method != "GET" and "/deployments/" in r.path]
                    cond = ready(fake.get("servicedefinitions", "team-b", "web"))
                    assert cond["status"] == "False" and cond["reason"] == "Conflict"
                    assert "installation trio-supervisor" in cond["message"]
                    assert [e for e in fake.objects("events", "team-b")
                            if e["reason"] == "Conflict"]
                    assert not events(fake, "DriftRepaired")
                    # The first installation's parent goes: the second one's child follows.
                    fake.delete("servicedefinitions", CONTROL, "web")
                    await h.until(lambda: (fake.get("deployments", APPS, "web") or {}).get(
                        "metadata", {}).get("labels", {}).get(INSTALLATION_KEY) == "team-b")
                    await h.until(lambda: ready(fake.get("servicedefinitions", "team-b", "web"))[
                        "status"] == "True")
                    assert container(fake.get("deployments", APPS, "web"))["image"] == "httpd:2.4"
                    nursery.cancel_scope.cancel()
            finally:
                with trio.move_on_after(2, shield=True):
                    await other.aclose()


async def test_a_child_already_terminating_is_not_deleted_again(tmp_path: Path) -> None:
    # A child held by another controller's finalizer stays Terminating after
    # our delete. Deleting it again on every relist, resync or watch event is a write
    # that changes nothing (and on a real server, whether the second one happened
    # depended on whether the watch event came before or after the delete's answer).
    def seed(fake: FakeApiServer) -> None:
        going = _ours("going", "going")
        going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        going["metadata"]["finalizers"] = ["example.com/hold"]
        fake.put_raw(going)

    with trio.fail_after(10):
        async with harness(tmp_path, before_start=seed) as h:
            fake = h.fake
            await h.reconciler.synced.wait()
            await h.idle()
            await h.reconciler.resync()
            await h.idle()
            assert fake.find_requests("DELETE", "/deployments/going") == []
            assert fake.get("deployments", APPS, "going") is not None


async def test_status_writes_failing_with_500_only(tmp_path: Path) -> None:
    # The API server answers 500 to status writes only. The children are
    # applied once, not again on every retry; the retries back off; one ApplyFailed Event;
    # once status writes work again the parent shows Ready.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            rule = fake.inject("PATCH", r"/servicedefinitions/web/status$", status=500,
                               times=None)
            fake.create(sd("web"))
            # Six: the backoff doubles from 0.05 s, but an attempt's own failure report (an
            # Event, a status write) runs while its requeue's delay does, and the child's
            # ADDED event adds an attempt at once: the first gaps may all be short.
            await h.until(lambda: h.metric("fanout_requeues", kind="ServiceDefinition",
                                           cause="error") >= 6)
            assert fake.count("POST", "/deployments/web") == 1
            assert events(fake, "Applied", "web") == []  # off by default
            assert len(events(fake, "ApplyFailed", "web")) == 1  # the spam filter
            tries = fake.find_requests("PATCH", "/servicedefinitions/web/status")
            gaps = [b.time - a.time for a, b in itertools.pairwise(tries)]
            assert max(gaps) >= 0.05  # backed off, not hot
            fake.injections.remove(rule)
            await h.until(lambda: (ready(fake.get("servicedefinitions", CONTROL, "web"))
                                   or {}).get("status") == "True")
            await h.idle()
            assert fake.count("POST", "/deployments/web") == 1


async def test_the_apps_namespace_deleted_and_made_again(tmp_path: Path) -> None:
    # The apps namespace is deleted (its contents first, as the namespace
    # controller does) and made again. Meanwhile writes there are refused (404); the
    # children come back once it exists again, without a restart.
    with trio.fail_after(15):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("web", port=80))
            await h.until(lambda: fake.get("services", APPS, "web") is not None)
            fake.delete("services", APPS, "web")
            fake.delete("deployments", APPS, "web")
            fake.delete("namespaces", None, APPS)
            await h.until(lambda: h.metric("fanout_requeues", kind="ServiceDefinition",
                                           cause="error") >= 1 or h.status.state == "preflight")
            fake.create_namespace(APPS)
            await h.until(lambda: fake.get("deployments", APPS, "web") is not None
                          and fake.get("services", APPS, "web") is not None)
            await h.until(lambda: h.status.state == "watching")
            await h.until(lambda: (ready(fake.get("servicedefinitions", CONTROL, "web"))
                                   or {}).get("status") == "True")


async def test_a_hand_edited_lineage_label_is_repaired_not_deleted(tmp_path: Path) -> None:
    # The lineage label of a child is edited by hand to name another parent
    # (one that does not exist, or another one). The reconcile of the parent it now names
    # deleted it as "not mine any more" while its real parent repaired it: the Deployment
    # was deleted and made again (every pod restarted) instead of having a label put back.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            for name in ("web", "api"):
                fake.create(sd(name))
            await h.until(lambda: all(ready(fake.get("servicedefinitions", CONTROL, n))
                                      for n in ("web", "api")))
            await h.idle()
            uid = fake.get("deployments", APPS, "web")["metadata"]["uid"]
            for other in ("ghost", "api"):
                fake.patch("deployments", APPS, "web",
                           {"metadata": {"labels": {LINEAGE_SERVICEDEFINITION: other}}},
                           field_manager="kubectl-label")
                await h.until(lambda: (fake.get("deployments", APPS, "web") or {}).get(
                    "metadata", {}).get("labels", {}).get(LINEAGE_SERVICEDEFINITION) == "web")
                await h.idle()
                await h.reconciler.resync()
                await h.idle()
            assert fake.find_requests("DELETE", "/deployments/") == []
            assert fake.get("deployments", APPS, "web")["metadata"]["uid"] == uid
            assert fake.get("deployments", APPS, "api") is not None


async def test_two_kinds_with_a_parent_of_the_same_name_keep_apart(tmp_path: Path) -> None:
    # A ServiceDefinition and a Workflow both named "x" (children named after
    # their parent). Their children are of different resources and carry different
    # lineage labels: neither kind's reconcile or sweep touches the other's.
    from supervisor.config import KubernetesConfig
    from supervisor.fanout.engine import FanoutEngine
    from supervisor.fanout.status import FanoutStatus
    from supervisor.kube.client import KubeClient
    from supervisor.telemetry import Metrics

    with trio.fail_after(15):
        async with harness(tmp_path) as h:
            fake = h.fake
            client = KubeClient.from_kubeconfig(str(tmp_path / "kubeconfig"))
            config = KubernetesConfig(enabled=True, kubeconfig=str(tmp_path / "kubeconfig"))
            workflows = FanoutEngine(client, WORKFLOW, config, Metrics(process=False),
                                     FanoutStatus(), FAST)
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(workflows.run)
                    fake.create(sd("x", port=80))
                    fake.create(wf("x"))
                    await h.until(lambda: all(fake.get(p, APPS, "x") is not None
                                              for p in ("deployments", "services", "cronjobs")))
                    for engine in (h.reconciler, workflows):
                        await engine.queue.wait_idle()
                        await engine.resync()
                        await engine.queue.wait_idle()
                    fake.delete("workflows", CONTROL, "x")
                    await h.until(lambda: fake.get("cronjobs", APPS, "x") is None)
                    await h.reconciler.resync()
                    await h.idle()
                    nursery.cancel_scope.cancel()
            finally:
                with trio.move_on_after(2, shield=True):
                    await client.aclose()
            assert fake.get("deployments", APPS, "x") is not None
            assert fake.get("services", APPS, "x") is not None
            assert [r.path for r in fake.find_requests("DELETE")] == [
                f"/apis/batch/v1/namespaces/{APPS}/cronjobs/x"]
