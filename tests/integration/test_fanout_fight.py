"""The parent's status while another writer fights over a child (a review finding).

Against the fake API server. When something undoes each repair of a child (deletes it,
or edits a field we set, right after each repair), the repair limiter defers the next
repair (1 s, 2 s ... up to 60 s). The reconcile that skipped the child went on to write
``Ready=True`` "N objects applied" while the child was missing or wrong: the parent's
status lied. Now, while a repair is deferred, ``Ready`` is ``False`` (reason
``RepairDeferred``, the message naming the child and when its repair is retried), the
parent is requeued for that time (the periodic resync is an hour away here), and
``Ready`` is ``True`` again once the repaired child stays. A reconcile during the
deferral (a resync) does not write the status again.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import trio
from structlog.testing import capture_logs

from tests.fanout import (
    APPS,
    CONTROL,
    Harness,
    fights,
    harness,
    ready,
    recent_repairs,
    replicas_fighter,
    web_ready,
    web_replicas,
)

STATUS_PATH = f"/namespaces/{CONTROL}/servicedefinitions/web/status"


def status_writes(h: Harness) -> int:
    return len(h.fake.writes(STATUS_PATH))


def retry_time(message: str) -> dt.datetime:
    """The RFC 3339 time after "retried at" in a RepairDeferred message."""
    stamp = message.split("retried at ", 1)[1].split()[0].rstrip(",;)")
    return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def settled(h: Harness) -> bool:
    """Every reconcile started has finished (the queue is not idle while a requeue waits)."""
    finished = h.metric("fanout_reconcile_duration_seconds_count", kind="ServiceDefinition",
                        result="success")
    return finished == h.reconciler.reconciles


async def resync_while_deferred(h: Harness) -> None:
    """A reconcile during the deferral: no repair yet, no status write."""
    await h.until(lambda: settled(h))
    writes = status_writes(h)
    before = h.reconciler.reconciles
    await h.reconciler.resync()
    await h.until(lambda: h.reconciler.reconciles > before and settled(h))
    assert status_writes(h) == writes


def ready_condition(h: Harness) -> dict[str, Any]:
    cond = ready(h.fake.get("servicedefinitions", CONTROL, "web"))
    assert cond is not None
    return cond


async def test_a_deleted_child_whose_repair_is_deferred_makes_the_parent_not_ready(
    tmp_path: Path,
) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await web_ready(h)
            with capture_logs() as logs:
                for _ in range(3):  # the limiter's burst: repaired at once
                    fake.delete("deployments", APPS, "web")
                    await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
                    await h.idle()
                fake.delete("deployments", APPS, "web")
                await h.until(lambda: bool(fights(logs)))
                deferred_at = trio.current_time()
                wall = dt.datetime.now(dt.UTC)
                (fight,) = fights(logs)
                await h.until(lambda: ready_condition(h)["status"] == "False")
                cond = ready_condition(h)
                assert fake.get("deployments", APPS, "web") is None
                assert cond["reason"] == "RepairDeferred"
                assert "Deployment apps/web" in cond["message"]
                at = retry_time(cond["message"])
                expected = wall + dt.timedelta(seconds=fight["delay_s"])
                assert abs((at - expected).total_seconds()) <= 1.5, (at, expected)
                await resync_while_deferred(h)
                assert fake.get("deployments", APPS, "web") is None  # not before its time
                # Requeued for the end of the delay: repaired then, not at the resync
                # (an hour away in these tests).
                await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
                waited = trio.current_time() - deferred_at
                assert waited <= fight["delay_s"] + 0.5, (waited, fight["delay_s"])
                await h.until(lambda: ready_condition(h)["status"] == "True")
                assert ready_condition(h)["reason"] == "Applied"
                await h.idle()
            assert recent_repairs(h) == 4
            writes = status_writes(h)
            await h.reconciler.resync()  # idle: nothing to write
            await h.idle()
            assert status_writes(h) == writes


async def test_an_edited_child_whose_repair_is_deferred_makes_the_parent_not_ready(
    tmp_path: Path,
) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await web_ready(h)

            with capture_logs() as logs:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(replicas_fighter, h)
                    await h.until(lambda: bool(fights(logs)))
                    await h.until(lambda: ready_condition(h)["status"] == "False")
                    nursery.cancel_scope.cancel()  # the other controller gives up
                cond = ready_condition(h)
                assert cond["reason"] == "RepairDeferred"
                assert "Deployment apps/web" in cond["message"]
                assert web_replicas(fake) == 5
                await h.until(lambda: web_replicas(fake) == 1)
                await h.until(lambda: ready_condition(h)["status"] == "True")
                assert ready_condition(h)["reason"] == "Applied"
