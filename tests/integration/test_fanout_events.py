"""Events on the parents (fake API server): few, and counted rather than repeated.

``Applied`` is written only with ``[kubernetes].applied_events`` (a bulk create
wrote one Event per parent, a third of its writes); repeats of the same reason
on the same parent within a minute are counted into one Event, as client-go's
event correlator does.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fanout import APPS, CONTROL, FAST, harness, ready, sd


def parent_events(objects: list[dict[str, Any]], reason: str, name: str) -> list[dict[str, Any]]:
    return [e for e in objects if e["reason"] == reason and e["involvedObject"]["name"] == name]


def applied(obj: dict[str, Any] | None) -> bool:
    return (ready(obj) or {}).get("reason") == "Applied"


@pytest.mark.chaos  # over 10 s through the real process: run by CI's `pytest -m chaos`
async def test_a_bulk_of_200_parents_writes_no_applied_event_by_default(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with harness(tmp_path) as h:
            fake = h.fake
            for i in range(200):
                fake.create(sd(f"p{i:03}"))
            await h.until(lambda: sum(applied(o) for o in fake.objects("servicedefinitions",
                                                                       CONTROL)) == 200)
            await h.idle()
            assert fake.objects("events", CONTROL) == []
            # One write a child and one status write a parent.
            creates = fake.find_requests("POST", f"/namespaces/{APPS}/deployments")
            statuses = [r for r in fake.find_requests("PATCH", "/status") if r.changed]
            assert len(creates) == 200 and len(statuses) == 200
            assert len(fake.writes()) == 400


async def test_applied_events_when_asked_for(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path, settings={"applied_events": True}) as h:
            fake = h.fake
            fake.create(sd("web"))
            await h.until(lambda: applied(fake.get("servicedefinitions", CONTROL, "web")))
            (event,) = parent_events(fake.objects("events", CONTROL), "Applied", "web")
            assert event["message"] == f"applied Deployment {APPS}/web"


async def test_twenty_failures_of_one_parent_in_a_minute_make_one_event_with_a_count(
    tmp_path: Path,
) -> None:
    tuning = replace(FAST, requeue_initial_s=0.01, requeue_max_s=0.02)
    with trio.fail_after(20):
        async with harness(tmp_path, tuning=tuning) as h:
            fake = h.fake
            fake.inject("POST", rf"/namespaces/{APPS}/deployments/web$", status=500, times=20)
            started = trio.current_time()
            fake.create(sd("web"))
            await h.until(lambda: applied(fake.get("servicedefinitions", CONTROL, "web")))
            assert trio.current_time() - started < 60
            (event,) = parent_events(fake.objects("events", CONTROL), "ApplyFailed", "web")
            assert event["count"] == 20
            assert event["lastTimestamp"] >= event["firstTimestamp"]
            assert event["type"] == "Warning" and "HTTP 500" in event["message"]
            # One create, then each repeat patched into it.
            events = fake.find_requests(None, f"/namespaces/{CONTROL}/events")
            assert [r.method for r in events] == ["POST"] + ["PATCH"] * 19


async def test_a_counted_event_deleted_meanwhile_is_recorded_again_and_counted_on(
    tmp_path: Path,
) -> None:
    # The Event we count into is gone (expired, or deleted by hand): its patch is a 404.
    tuning = replace(FAST, requeue_initial_s=0.01, requeue_max_s=0.02)
    with trio.fail_after(20):
        async with harness(tmp_path, tuning=tuning) as h:
            fake = h.fake
            failing = fake.inject("POST", rf"/namespaces/{APPS}/deployments/web$", status=500,
                                  times=None)
            fake.create(sd("web"))

            def counted(at_least: int) -> list[dict[str, Any]]:
                return [e for e in parent_events(fake.objects("events", CONTROL),
                                                 "ApplyFailed", "web")
                        if e["count"] >= at_least]

            await h.until(lambda: counted(2))
            (first,) = counted(2)
            fake.delete("events", CONTROL, first["metadata"]["name"])
            await h.until(lambda: counted(2))
            fake.injections.remove(failing)
            await h.until(lambda: applied(fake.get("servicedefinitions", CONTROL, "web")))
            (again,) = parent_events(fake.objects("events", CONTROL), "ApplyFailed", "web")
            assert again["metadata"]["name"] != first["metadata"]["name"]
            assert again["count"] >= 2
            patches = fake.find_requests("PATCH", f"/namespaces/{CONTROL}/events/")
            assert [r.status for r in patches].count(404) == 1
