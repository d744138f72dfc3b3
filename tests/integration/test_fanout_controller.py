"""The fan-out as a controller, against the fake API server over HTTP.

Drift repair by watching the children, the sweep guard, quiet reconciles and
requeue backoff, Events and the Available condition, a missing child API, and
the bounded drain. What a real kube-apiserver can show is also tested there
(tests/integration/test_realkube.py); these are the cases only the fake can
make (faults, 409/429 on demand, hanging requests) or makes cheaper.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
from structlog.testing import capture_logs

from supervisor import reasons
from supervisor.fanout.workflow import WORKFLOW
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.apiserver_store import DEFAULT_RESOURCES
from tests.fanout import (
    APPS,
    CONTROL,
    FAST,
    _ours,
    container,
    events,
    harness,
    ready,
    replicas_fighter,
    sd,
    wf,
)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return cond  # type: ignore[no-any-return]
    return None


async def test_a_deleted_child_is_repaired_at_once_with_a_drift_event(tmp_path: Path) -> None:
    # Finding 1: a child deleted by hand came back only at the periodic resync (297 s).
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("web", port=8080))
            await h.until(lambda: ready(fake.get("servicedefinitions", CONTROL, "web")))
            await h.idle()
            assert not events(fake, "Applied", "web")  # off by default
            fake.delete("deployments", APPS, "web")
            deleted_at = trio.current_time()
            await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
            assert trio.current_time() - deleted_at < 1.0
            await h.until(lambda: bool(events(fake, "DriftRepaired", "web")))
            (event,) = events(fake, "DriftRepaired", "web")
            assert event["type"] == "Normal"
            assert "Deployment apps/web (deleted)" in event["message"]
            assert event["involvedObject"]["kind"] == "ServiceDefinition"
            assert h.metric("fanout_drift_repairs", kind="ServiceDefinition") == 1


async def test_an_edited_child_is_repaired_and_nothing_is_written_when_nothing_drifted(
    tmp_path: Path,
) -> None:
    # Finding 1: an edit by hand (replicas 1 -> 3, the image) was never repaired.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("web"))
            await h.until(lambda: ready(fake.get("servicedefinitions", CONTROL, "web")))
            await h.idle()

            fake.patch("deployments", APPS, "web", {"spec": {"replicas": 3}},
                       field_manager="kubectl-edit")
            await h.until(lambda: (fake.get("deployments", APPS, "web") or {})
                          ["spec"]["replicas"] == 1)
            fake.patch("deployments", APPS, "web", {"spec": {"template": {"spec": {
                "containers": [{"name": "main", "image": "evil:latest"}]}}}},
                field_manager="kubectl-edit")
            await h.until(lambda: container(fake.get("deployments", APPS, "web") or {})
                          ["image"] == "nginx:1.27")
            await h.idle()
            assert h.metric("fanout_drift_repairs", kind="ServiceDefinition") == 2

            # Not drift: the Deployment controller writes status, someone adds a label of
            # their own. Each enqueues the parent; neither makes a write.
            before = len(fake.requests)
            reconciles = h.reconciler.reconciles
            fake.set_status("deployments", APPS, "web", {"replicas": 1})
            fake.patch("deployments", APPS, "web",
                       {"metadata": {"labels": {"team": "a"}}}, field_manager="kubectl-label")
            await h.until(lambda: h.reconciler.reconciles >= reconciles + 2)
            await h.idle()
            assert [r for r in fake.requests[before:] if r.method != "GET"] == []


async def test_a_status_only_update_of_a_parent_does_not_enqueue_it(tmp_path: Path) -> None:
    # Finding 4: our own status writes came back as events and re-queued the parent.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            for i in range(4):
                fake.create(sd(f"svc-{i}"))
            await h.until(lambda: all(ready(fake.get("servicedefinitions", CONTROL, f"svc-{i}"))
                                      for i in range(4)))
            await h.idle()
            reconciles = h.reconciler.reconciles
            # Status-only writes by someone else: no generation, label or annotation change.
            for i in range(4):
                fake.set_status("servicedefinitions", CONTROL, f"svc-{i}",
                                {"observedGeneration": 1, "conditions": []},
                                field_manager="someone")
            fake.patch("servicedefinitions", CONTROL, "svc-0",
                       {"metadata": {"labels": {"tier": "web"}}})  # this one matters
            await h.until(lambda: h.reconciler.reconciles >= reconciles + 1)
            await h.idle()
            assert h.reconciler.reconciles == reconciles + 1


async def test_a_409_and_a_429_are_retried_after_the_backoff_not_at_once(
    tmp_path: Path,
) -> None:
    # Finding 4: the first retry after a 409 or 429 ran at once.
    tuning = replace(FAST, requeue_initial_s=0.4, requeue_max_s=2.0)
    with trio.fail_after(15):
        async with harness(tmp_path, tuning=tuning) as h:
            fake = h.fake
            fake.inject("POST", r"/deployments/web$", status=409, times=1)
            fake.create(sd("web"))
            await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
            tries = fake.find_requests("POST", "/deployments/web")
            assert len(tries) == 2 and tries[0].status == 409
            assert tries[1].time - tries[0].time >= 0.2  # 0.4 s jittered down to half at most

            fake.inject("POST", r"/deployments/api$", status=429,
                        headers={"Retry-After": "1"}, times=1)
            fake.create(sd("api"))
            await h.until(lambda: fake.get("deployments", APPS, "api") is not None)
            tries = fake.find_requests("POST", "/deployments/api")
            assert len(tries) == 2 and tries[0].status == 429
            assert tries[1].time - tries[0].time >= 1.0
            await h.idle()
            assert h.metric("fanout_requeues", kind="ServiceDefinition", cause="conflict") == 1
            assert h.metric("fanout_requeues", kind="ServiceDefinition", cause="throttled") == 1
            assert events(fake, "ApplyFailed", "web")
            assert h.metrics.registry.get_sample_value(
                "supervisor_fanout_reconcile_duration_seconds_count",
                {"kind": "ServiceDefinition", "result": "conflict"}) == 1


async def test_available_follows_the_deployment_status(tmp_path: Path) -> None:
    # Finding 5: Ready=True meant only "applied"; nothing reported availability.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("web", replicas=2))
            await h.until(lambda: ready(fake.get("servicedefinitions", CONTROL, "web")))
            parent = fake.get("servicedefinitions", CONTROL, "web")
            available = condition(parent, "Available")
            assert available is not None and available["status"] == "False"
            assert available["message"].startswith("Deployment web:")
            deployment = fake.get("deployments", APPS, "web")
            assert deployment is not None
            fake.set_status("deployments", APPS, "web", {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": 2, "availableReplicas": 2})
            await h.until(lambda: (condition(fake.get("servicedefinitions", CONTROL, "web"),
                                             "Available") or {}).get("status") == "True")
            # The child deleted: not available until it is back (and it comes back).
            fake.delete("deployments", APPS, "web")
            await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
            await h.until(lambda: (condition(fake.get("servicedefinitions", CONTROL, "web"),
                                             "Available") or {}).get("status") == "False")


async def test_an_invalid_child_records_an_invalid_event(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path, kind=WORKFLOW) as h:
            fake = h.fake
            fake.create(wf("bad", schedule="not a schedule"))
            await h.until(lambda: bool(events(fake, "Invalid", "bad")))
            (event,) = events(fake, "Invalid", "bad")
            assert event["type"] == "Warning"
            assert "schedule" in event["message"]


async def test_the_sweep_guard_refuses_a_mass_delete_until_a_resync_confirms_it(
    tmp_path: Path,
) -> None:
    # Finding 3: the sweep trusted whatever parent list it got.
    def seed(fake: FakeApiServer) -> None:
        fake.create(sd("kept"))
        fake.create(_ours("kept", "kept"), field_manager="trio-supervisor")
        for i in range(8):  # eight children whose parents are not in the list
            fake.create(_ours(f"lost-{i}", f"lost-{i}"), field_manager="trio-supervisor")

    tuning = replace(FAST, resync_s=1.0)
    with trio.fail_after(10), capture_logs() as logs:
        async with harness(tmp_path, tuning=tuning, before_start=seed) as h:
            fake = h.fake
            await h.until(lambda: h.reconciler.synced.is_set())
            assert len(fake.objects("deployments", APPS)) == 9  # nothing deleted
            refused = [e for e in logs if "sweep refused" in str(e.get("event"))]
            assert len(refused) == 1
            assert refused[0]["log_level"] == "error"
            assert refused[0]["count"] == 8 and refused[0]["seen"] == 9
            assert "8 of the 9" in str(refused[0])
            assert h.metric("fanout_sweeps_refused", kind="ServiceDefinition") == 1
            # The next resync sees the same parent list: the sweep goes ahead.
            await h.until(lambda: len(fake.objects("deployments", APPS)) == 1)
            assert fake.get("deployments", APPS, "kept") is not None


async def test_a_child_api_the_server_does_not_serve_is_reported_as_such(
    tmp_path: Path,
) -> None:
    # Finding 6: on a server without batch/v1 CronJob the hint was manifests/apps-namespace.
    without_cronjobs = tuple(r for r in DEFAULT_RESOURCES if r.plural != "cronjobs")
    with trio.fail_after(10), capture_logs() as logs:
        async with harness(tmp_path, kind=WORKFLOW, resources=without_cronjobs) as h:
            await h.until(lambda: h.metric("fanout_preflight_failures", kind="Workflow",
                                           error_class=reasons.CHILD_API_MISSING) >= 1)
            assert h.status.state == "preflight"
            assert h.status.last_error_class == reasons.CHILD_API_MISSING
    (line, *_) = [e for e in logs if e.get("error_class") == reasons.CHILD_API_MISSING]
    assert line["log_level"] == "error"
    assert "batch/v1 cronjobs" in str(line)
    assert "apps-namespace" not in str(line)


async def test_shutdown_gives_an_in_flight_apply_a_bounded_drain(tmp_path: Path) -> None:
    tuning = replace(FAST, drain_s=0.5)
    with trio.fail_after(10):
        async with harness(tmp_path, tuning=tuning) as h:
            fake = h.fake
            fake.inject("POST", r"/deployments/web$", status=200, hang=True, times=1)
            fake.create(sd("web"))
            await h.until(lambda: fake.count("POST", "/deployments/web") >= 1)
            assert h.reconciler.drain.inflight  # the write is in flight
            # Leaving the harness cancels the reconciler, as the tree does at shutdown:
            # the write is not cut at once, and not waited for beyond the drain either.
            start = trio.current_time()
        elapsed = trio.current_time() - start
        assert 0.45 <= elapsed < 1.5


async def test_the_watch_backoff_starts_over_after_a_stream_that_delivered(
    tmp_path: Path,
) -> None:
    # Finding 5: the backoff grew across separate outages (0.4 -> 1.4 -> 3.1 -> 8.1 s)
    # because a stream that delivered and was then cut never reset it.
    with trio.fail_after(20), capture_logs() as logs:
        async with harness(tmp_path) as h:
            fake = h.fake
            await h.until(lambda: h.status.state == "watching")
            for outage in range(3):
                # parents; deployments and services, ours and other installations'
                await fake.wait_for_watches(5)
                fake.create(sd(f"web-{outage}"))  # the stream delivers
                name, seen = f"web-{outage}", outage
                await h.until(lambda: fake.get("deployments", APPS, name) is not None)  # noqa: B023
                fake.stall_watches()  # cut: nothing arrives until the inactivity deadline
                await h.until(lambda: len(retries(logs)) > seen)  # noqa: B023
                fake.unstall_watches()
    delays = [e["delay_s"] for e in retries(logs)]
    assert len(delays) >= 3
    # Every outage starts again from the initial delay (0.05 s, jittered down to half).
    assert all(delay <= FAST.watch.backoff_initial_s for delay in delays), delays


def retries(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("event") == "watch failed; retrying"
            and str(e.get("resource", "")).startswith("servicedefinitions")]


async def test_a_writer_that_keeps_undoing_repairs_does_not_make_a_hot_loop(
    tmp_path: Path,
) -> None:
    with trio.fail_after(15), capture_logs() as logs:
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("web"))
            await h.until(lambda: ready(fake.get("servicedefinitions", CONTROL, "web")))

            def repairs() -> float:
                return h.metric("fanout_drift_repairs", kind="ServiceDefinition")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(replicas_fighter, h)
                await h.until(lambda: repairs() >= 3)
                third = trio.current_time()
                await h.until(lambda: repairs() >= 5)
                fifth, at_fifth = trio.current_time(), repairs()
                nursery.cancel_scope.cancel()
    # Three at once, then 1 s and 2 s apart: the fifth 3 s after the third, not a hot loop.
    assert at_fifth == 5 and fifth - third >= 3.0 - 0.1, (at_fifth, fifth - third)
    fights = [e for e in logs if "keeps drifting" in str(e.get("event"))]
    assert len(fights) == 1 and fights[0]["log_level"] == "warning"


async def test_the_queue_depth_gauge_shows_parents_waiting_for_a_worker(tmp_path: Path) -> None:
    # fanout_queue_depth{kind} counts parents queued and not yet taken.
    tuning = replace(FAST, workers=1, drain_s=0.1)
    with trio.fail_after(10):
        async with harness(tmp_path, tuning=tuning) as h:
            fake = h.fake
            assert h.metric("fanout_queue_depth", kind="ServiceDefinition") == 0
            fake.inject("POST", r"/deployments/a$", status=200, hang=True, times=1)
            for name in ("a", "b", "c"):
                fake.create(sd(name))
            await h.until(lambda: fake.count("POST", "/deployments/a") >= 1
                          and len(h.reconciler.parents) == 3)
            # The one worker hangs on a's apply: b and c wait.
            assert h.metric("fanout_queue_depth", kind="ServiceDefinition") == 2
