"""A stuck or failing API server shows in the fan-out's status, metrics and log.

The fan-out engine against the fake API server's fault modes, over real HTTP on
loopback: watch headers that never come, a list that never answers, child
writes answered 500. Each is retried, shows in the kind's ``state`` and
``last_error_class`` while it lasts, counts in ``fanout_errors``, and heals
within a bounded time once the fault clears.
"""

from __future__ import annotations

from pathlib import Path

import trio
from structlog.testing import capture_logs

from supervisor import reasons
from supervisor.kube.wire import MAX_WATCH_LINE_BYTES
from tests.fanout import APPS, CONTROL, Harness, harness, sd

KIND = {"kind": "ServiceDefinition"}


def errors(h: Harness, error_class: str) -> float:
    return h.metric("fanout_errors", **KIND, **{"class": error_class})


async def test_a_watch_whose_headers_never_come_is_retried_and_shows(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with harness(tmp_path, client_timeout_s=1.0) as h:
            fake = h.fake
            await h.until(lambda: h.status.state == "watching")
            held = fake.hold_watch_headers("servicedefinitions")
            fake.close_watches("servicedefinitions")  # the re-watch gets no headers
            # The held one given up at the request timeout (1 s here) and retried.
            await h.until(lambda: held.hits >= 2)
            assert h.status.state != "watching"  # no watch open
            assert h.status.last_error_class == reasons.TIMEOUT
            assert errors(h, reasons.TIMEOUT) >= 1
            fake.create(sd("late"))
            fake.clear_injections()
            with trio.fail_after(5):  # the next retry, within the backoff's 0.2 s ceiling
                await h.until(lambda: fake.get("deployments", APPS, "late") is not None)
            await h.until(lambda: h.status.state == "watching")
            assert h.status.last_error_class is None


async def test_a_watch_the_server_ended_is_not_watching_until_the_next_one_opens(
        tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with harness(tmp_path, client_timeout_s=3.0) as h:
            fake = h.fake
            await h.until(lambda: h.status.state == "watching")
            held = fake.hold_watch_headers("servicedefinitions")
            fake.close_watches("servicedefinitions")  # ended normally (timeoutSeconds)
            await h.until(lambda: held.hits >= 1)  # its re-watch sent, headers held
            # Between two watches, none open: the state the first watch opens in, and
            # no failure (a normal end is none) until the re-watch times out.
            assert h.status.state == "preflight"
            assert h.status.last_error_class is None
            fake.clear_injections()
            await h.until(lambda: h.status.state == "watching")


async def test_a_list_that_never_answers_is_retried_and_shows(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with harness(tmp_path, client_timeout_s=1.0) as h:
            fake = h.fake
            await h.until(lambda: h.status.state == "watching")
            # The informer's list (a page of 50); the preflight's limit=1 is answered.
            hung = fake.inject("GET", r"/servicedefinitions$", status=200, hang=True,
                               times=None, query_contains="limit=50")
            fake.compact()
            fake.close_watches("servicedefinitions")  # 410: a relist, which hangs
            await h.until(lambda: hung.hits >= 2)
            assert h.status.state != "watching"
            assert h.status.last_error_class == reasons.TIMEOUT
            fake.create(sd("late"))
            fake.clear_injections()
            with trio.fail_after(5):
                await h.until(lambda: fake.get("deployments", APPS, "late") is not None)
            await h.until(lambda: h.status.state == "watching")
            assert h.status.last_error_class is None
            assert fake.get("servicedefinitions", CONTROL, "late") is not None


async def test_child_writes_failing_show_and_are_logged_once_per_parent(tmp_path: Path) -> None:
    parents = 30
    with trio.fail_after(90):  # about 25 s alone; the machine is shared
        async with harness(tmp_path) as h:
            fake = h.fake
            for i in range(parents):
                fake.create(sd(f"p{i:02}"))
            await h.until(lambda: all(fake.get("deployments", APPS, f"p{i:02}") is not None
                                      for i in range(parents)))
            await h.idle()
            outage = fake.inject("PATCH", rf"/namespaces/{APPS}/deployments/", status=500,
                                 times=None)
            with capture_logs() as logs:
                for i in range(parents):
                    fake.patch("servicedefinitions", CONTROL, f"p{i:02}",
                               {"spec": {"image": "nginx:1.28"}})
                # Three refused writes a parent, each counted.
                await h.until(lambda: errors(h, reasons.SERVER_ERROR) >= 3 * parents)
                assert outage.hits >= 3 * parents
                assert h.status.last_error_class == reasons.SERVER_ERROR
                assert h.status.state == "watching"  # the watches are fine
                fake.clear_injections()
                await h.until(lambda: all(
                    fake.get("deployments", APPS, f"p{i:02}")["spec"]["template"]["spec"]
                    ["containers"][0]["image"] == "nginx:1.28" for i in range(parents)))
                await h.idle()
            warned = [e for e in logs if e["log_level"] == "warning"]
            failed = [e for e in warned if e["event"] == "reconcile failed; requeued"]
            # Once per parent's streak, not at every retry (about 8 retries a parent here).
            assert sorted(e["name"] for e in failed) == [f"p{i:02}" for i in range(parents)]
            assert not [e for e in warned if e.get("name") and e not in failed]
            assert {e["error_class"] for e in failed} == {reasons.SERVER_ERROR}
            ended = [e for e in logs if e["event"] == "reconcile succeeds again"]
            assert sorted(e["name"] for e in ended) == [f"p{i:02}" for i in range(parents)]
            assert all(e["failures"] >= 1 and e["log_level"] == "info" for e in ended)
            assert h.status.last_error_class is None


async def test_a_watch_line_over_its_bound_restarts_the_watch_and_shows(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with harness(tmp_path) as h:
            fake = h.fake
            await h.until(lambda: h.status.state == "watching")
            informer = h.reconciler.informer
            assert informer is not None
            watches = len(fake.find_requests("GET", "/servicedefinitions", watch=True))
            with capture_logs() as logs:
                fake.inject_watch_line(b'{"type": "ADDED", "object": {"metadata": {"name": "'
                                       + b"x" * MAX_WATCH_LINE_BYTES + b'"}}}',
                                       "servicedefinitions")
                await h.until(lambda: errors(h, reasons.TOO_LARGE) == 1)
            (refused,) = [e for e in logs if e["event"] == "watch failed; retrying"]
            assert "one line: more than" in refused["error"]
            assert len(refused["error"]) < 2048
            fake.create(sd("after"))
            await h.until(lambda: fake.get("deployments", APPS, "after") is not None)
            # Re-watched from where it was, not relisted.
            assert len(fake.find_requests("GET", "/servicedefinitions", watch=True)) > watches
            assert informer.lists == 1
            await h.until(lambda: h.status.state == "watching")
            assert h.status.last_error_class is None
