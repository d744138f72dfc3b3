"""Failed repairs during an outage of the apps namespace are not drift (a review finding).

Against the fake API server. A child deleted by hand is drift; its repair is slowed
down by the drift-repair limiter only when repairs keep *succeeding* and being undone
("a child keeps drifting right after each repair"). A repair the server refuses (the
apps namespace terminating: 403 "being terminated"; a 503; a 504 timeout) changed
nothing: it is a failed write, requeued with its own backoff, reported ApplyFailed.
Counting those attempts as repairs made an outage of more than three attempts log a
fight that never happened, slowed the repair once the server came back (1 s, 2 s ...
up to 60 s), and reported the parent Ready=True "applied" while its child was missing
(the limited reconcile skipped the write and went on as if it had been made).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from tests.fanout import APPS, CONTROL, events, fights, harness, ready, recent_repairs, web_ready

KIND = {"kind": "ServiceDefinition"}
TERMINATING = {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": 'deployments.apps "web" is forbidden: unable to create new content in'
               f" namespace {APPS} because it is being terminated",
    "reason": "Forbidden", "details": {"name": "web", "group": "apps", "kind": "deployments"},
    "code": 403,
}
OUTAGES = [
    pytest.param(403, TERMINATING, id="403-namespace-terminating"),
    pytest.param(503, None, id="503-unavailable"),
    pytest.param(504, None, id="504-timeout"),
]


@pytest.mark.parametrize(("code", "body"), OUTAGES)
async def test_failed_repair_writes_during_an_outage_are_not_drift(
    tmp_path: Path, code: int, body: Any,
) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await web_ready(h)
            outage = fake.inject("POST", rf"/namespaces/{APPS}/deployments/web$",
                                 status=code, body=body, times=None)
            with capture_logs() as logs:
                fake.delete("deployments", APPS, "web")
                # Five refused repairs: more than the limiter's burst of three.
                await h.until(lambda: outage.hits >= 5)
                assert fights(logs) == []
                assert recent_repairs(h) == 0
                assert fake.get("deployments", APPS, "web") is None
                # Never reported applied while the child is missing.
                assert ready(fake.get("servicedefinitions", CONTROL, "web"))["status"] == "False"
                assert events(fake, "ApplyFailed", "web")
                fake.clear_injections()  # the server is back
                back = trio.current_time()
                await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
                # At the next retry (requeue backoff at most 0.2 s here), not after the
                # limiter's 1 s, 2 s, 4 s ...
                assert trio.current_time() - back < 1.0
                await h.until(lambda: ready(fake.get("servicedefinitions", CONTROL, "web"))
                              ["status"] == "True")
                await h.idle()
            assert fights(logs) == []
            # Once per streak, not per retry; its end said once, with how many failed.
            (failed,) = [e for e in logs if e["event"] == "reconcile failed; requeued"]
            assert failed["log_level"] == "warning" and failed["name"] == "web"
            (back_again,) = [e for e in logs if e["event"] == "reconcile succeeds again"]
            assert back_again["failures"] >= 5 and back_again["name"] == "web"
            assert recent_repairs(h) == 1  # the one repair made
            assert h.metric("fanout_drift_repairs", **KIND) == 1
            assert h.metric("fanout_applies", result="repaired", **KIND) == 1
            assert len(events(fake, "DriftRepaired", "web")) == 1


async def test_repairs_undone_after_an_outage_still_slow_down_and_say_so(tmp_path: Path) -> None:
    # The opposite: after the outage, repairs that succeed and are undone again are
    # counted from the first successful one: the burst of three at once, then the
    # fourth waits and the fight is logged once.
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            await web_ready(h)
            outage = fake.inject("POST", rf"/namespaces/{APPS}/deployments/web$",
                                 status=403, body=TERMINATING, times=4)
            with capture_logs() as logs:
                for repairs in range(1, 4):
                    fake.delete("deployments", APPS, "web")
                    await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
                    await h.idle()
                    assert outage.exhausted
                    assert recent_repairs(h) == repairs
                    assert fights(logs) == []
                fake.delete("deployments", APPS, "web")
                await h.until(lambda: bool(fights(logs)))
                assert fake.get("deployments", APPS, "web") is None  # not at once
                await h.until(lambda: fake.get("deployments", APPS, "web") is not None)
                await h.idle()
            (fight,) = fights(logs)
            assert fight["log_level"] == "warning" and fight["child"] == "web"
            assert 0 < fight["delay_s"] <= 1.0  # one burst over: 1 s after the third
            assert recent_repairs(h) == 4
            assert h.metric("fanout_drift_repairs", **KIND) == 4
