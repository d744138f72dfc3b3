"""A parent deleted while its children are being written.

Against the fake API server, whose ``hold()`` keeps a request in flight while the
test changes the server's state: the parent is deleted while its child's apply is
on the wire, or between the child apply and the parent's status write, or while
its child's apply is on the wire *and* its DELETED event is lost to a relist
(watch history compacted). Each time: no child is left for the deleted parent,
the 404 of the status write is quiet (no retry, no warning, no ApplyFailed), the
queue goes idle, and the next parent fans out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from structlog.testing import capture_logs

from supervisor.fanout.workflow import WORKFLOW
from supervisor.kube.applying import ChildKey
from tests.fanout import APPS, CONTROL, Harness, events, harness, ready, sd, wf

KIND = {"kind": "ServiceDefinition"}


def loud(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What was logged at warning or above."""
    return [e for e in logs if e["log_level"] in ("warning", "error", "critical")]


async def next_parent_fans_out(h: Harness) -> None:
    h.fake.create(sd("next"))
    await h.until(lambda: ready(h.fake.get("servicedefinitions", CONTROL, "next")))
    await h.idle()
    assert h.fake.get("deployments", APPS, "next") is not None


async def test_a_parent_deleted_while_its_child_apply_is_in_flight(tmp_path: Path) -> None:
    # The Deployment's apply is held until the engine has seen the parent's DELETED
    # event; then it lands (the child is made for a parent already gone), the Service
    # after it. The reconcile that follows (the delete was queued meanwhile) deletes both.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            held = fake.hold("POST", rf"/namespaces/{APPS}/deployments/web$")
            with capture_logs() as logs:
                fake.create(sd("web", port=8080))
                await h.until(lambda: held.arrived == 1)
                fake.delete("servicedefinitions", CONTROL, "web")
                await h.until(lambda: "web" not in h.reconciler.parents)
                held.release()
                await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
                await h.until(lambda: fake.get("deployments", APPS, "web") is None
                              and fake.get("services", APPS, "web") is None)
                await h.idle()
            assert loud(logs) == []
            # The status write, if one was made, was a quiet 404: never retried.
            assert [r.status for r in fake.find_requests("PATCH", "/servicedefinitions/web/status")
                    ] in ([], [404])
            assert h.metric("fanout_applies", result="applied", **KIND) == 2
            assert h.metric("fanout_applies", result="deleted", **KIND) == 2
            assert h.metric("fanout_requeues", cause="error", **KIND) == 0
            assert h.metric("fanout_objects", **KIND) == 0
            assert not events(fake, "ApplyFailed", "web")
            await next_parent_fans_out(h)
            assert [o["metadata"]["name"] for o in fake.objects("deployments", APPS)] == ["next"]


async def test_a_parent_deleted_between_the_child_apply_and_its_status_write(
    tmp_path: Path,
) -> None:
    # The status write is held; meanwhile the child changes (its event queues the parent
    # again), then the parent is deleted with its DELETED event held back (watches
    # stalled), so the status write's 404 comes first. It is taken quietly, and the
    # reconcile queued by the child's change writes no status again to the parent known
    # to be gone (it did: a second 404); the DELETED event then deletes the child.
    with trio.fail_after(10):
        async with harness(tmp_path, kind=WORKFLOW) as h:
            fake = h.fake
            held = fake.hold("PATCH", r"/workflows/nightly/status$")
            with capture_logs() as logs:
                fake.create(wf("nightly"))
                await h.until(lambda: held.arrived == 1)
                changed = fake.set_status("cronjobs", APPS, "nightly",
                                          {"lastScheduleTime": "2026-01-01T00:00:00Z"})
                await h.until(lambda: live_rv(h, "cronjobs", "nightly")
                              == changed["metadata"]["resourceVersion"])
                fake.stall_watches()
                fake.delete("workflows", CONTROL, "nightly")
                held.release()
                await h.until(lambda: fake.count("PATCH", "/workflows/nightly/status",
                                                 status=404) == 1)
                await h.idle()
                assert h.reconciler.reconciles == 2  # the child's change was reconciled
                assert fake.get("cronjobs", APPS, "nightly") is not None  # no event yet
                fake.unstall_watches()
                await h.until(lambda: fake.get("cronjobs", APPS, "nightly") is None)
                await h.idle()
            assert loud(logs) == []
            assert fake.count("PATCH", "/workflows/nightly/status") == 1
            kind = {"kind": "Workflow"}
            assert h.metric("fanout_requeues", cause="error", **kind) == 0
            assert h.metric("fanout_applies", result="deleted", **kind) == 1
            assert h.metric("fanout_objects", **kind) == 0
            assert not events(fake, "ApplyFailed", "nightly")
            fake.create(wf("next"))
            await h.until(lambda: ready(fake.get("workflows", CONTROL, "next")))
            assert fake.get("cronjobs", APPS, "next") is not None


def live_rv(h: Harness, plural: str, name: str) -> str | None:
    """The resourceVersion of the child the engine holds (None: none held)."""
    obj = h.reconciler.live.get(ChildKey(plural, name))
    return None if obj is None else str(obj["metadata"]["resourceVersion"])


async def test_a_parent_deleted_while_its_child_apply_is_in_flight_and_its_event_lost(
    tmp_path: Path,
) -> None:
    # As the first test, but the parent's DELETED event never comes: its watch ends and
    # the history is compacted, so the informer relists (410) without it. The relist's
    # sweep ran while the child's apply was still on the wire (nothing to sweep yet), and
    # the child the apply then made (its watch event no newer than the apply's answer, so
    # nothing queued) was left behind until the periodic resync (600 s by default).
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("keep"))
            await h.until(lambda: ready(fake.get("servicedefinitions", CONTROL, "keep")))
            await h.idle()
            held = fake.hold("POST", rf"/namespaces/{APPS}/deployments/web$")
            with capture_logs() as logs:
                fake.create(sd("web"))
                await h.until(lambda: held.arrived == 1)
                resyncs = h.reconciler.resyncs
                fake.stall_watches()
                fake.delete("servicedefinitions", CONTROL, "web")
                fake.compact()
                fake.close_watches("servicedefinitions")  # the DELETED event is dropped
                fake.unstall_watches()
                await h.until(lambda: h.reconciler.resyncs > resyncs)
                assert "web" not in h.reconciler.parents
                # The apply's answer reaches the engine before the child's watch event.
                fake.stall_watches()
                held.release()
                await h.until(lambda: live_rv(h, "deployments", "web") is not None)
                fake.unstall_watches()
                await h.until(lambda: fake.get("deployments", APPS, "web") is None)
                await h.idle()
            assert loud(logs) == []
            assert [e["name"] for e in logs if e["event"] == "orphan swept"] == ["web"]
            assert fake.count("PATCH", "/servicedefinitions/web/status", status=200) == 0
            assert h.metric("fanout_requeues", cause="error", **KIND) == 0
            assert h.metric("fanout_objects", **KIND) == 1
            assert fake.get("deployments", APPS, "keep") is not None
            await next_parent_fans_out(h)


async def test_a_late_sweep_never_confirms_a_refused_one(tmp_path: Path) -> None:
    # The relist drops every parent (as a restored-empty etcd would) while one child's
    # apply is on the wire: the relist's sweep is refused (the guard), and the sweep
    # after that apply lands must not count as the confirmation the guard waits for.
    names = [f"svc-{i}" for i in range(7)]
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            for name in names:
                fake.create(sd(name))
            await h.until(lambda: all(ready(fake.get("servicedefinitions", CONTROL, n))
                                      for n in names))
            await h.idle()
            held = fake.hold("POST", rf"/namespaces/{APPS}/deployments/web$")
            fake.create(sd("web"))
            await h.until(lambda: held.arrived == 1)
            resyncs = h.reconciler.resyncs
            fake.stall_watches()
            for name in [*names, "web"]:
                fake.delete("servicedefinitions", CONTROL, name)
            fake.compact()
            fake.close_watches("servicedefinitions")
            fake.unstall_watches()
            await h.until(lambda: h.reconciler.resyncs > resyncs)
            assert h.metric("fanout_sweeps_refused", **KIND) == 1
            fake.stall_watches()
            held.release()
            await h.until(lambda: live_rv(h, "deployments", "web") is not None)
            fake.unstall_watches()
            await h.idle()
            assert len(fake.objects("deployments", APPS)) == 8  # nothing swept
            assert h.metric("fanout_sweeps_refused", **KIND) == 1
            await h.reconciler.resync()  # the same parent list again: confirmed
            await h.idle()
            assert fake.objects("deployments", APPS) == []
