"""An API server whose resourceVersion went backwards (etcd restored from a backup).

A watcher holding RV N re-watching a server now at M < N would see nothing until
the server got past N again. kube-apiserver answers such a watch, after waiting a
few seconds, with "Too large resource version" (a 504 ``Timeout`` Status with the
cause ``ResourceVersionTooLarge``); the informer must relist on it as on a 410,
never back off into its preflight. The fake server plays the restore
(``reset_state``) and the answer; the fan-out reconciler runs in-process against
it as in ``test_fanout_watchers``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from structlog.testing import capture_logs

from supervisor.fanout.engine import FanoutTuning
from supervisor.fanout.labels import INSTALLATION_KEY, LINEAGE_SERVICEDEFINITION
from supervisor.kube.errors import ApiError, Gone, TransportError, api_error
from supervisor.kube.watching import WatchTuning, is_too_large_resource_version
from tests.fakes.apiserver_store import status_body, too_large_resource_version
from tests.fanout import APPS, CONTROL, FAST, harness, ready, sd

RESTORED = "newer than the server's"


def orphan_deployment(parent: str) -> dict[str, Any]:
    """A child of ``parent`` as a restored store may hold it without its parent."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": parent, "namespace": APPS, "labels": {
            "app.kubernetes.io/name": parent,
            "app.kubernetes.io/managed-by": "trio-supervisor",
            INSTALLATION_KEY: CONTROL,
            LINEAGE_SERVICEDEFINITION: parent}},
        "spec": {"selector": {"matchLabels": {"app": parent}},
                 "template": {"metadata": {"labels": {"app": parent}},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }


def too_large_body(requested: int = 83, current: int = 4) -> bytes:
    return json.dumps(too_large_resource_version(requested, current).status()).encode()


def test_too_large_is_recognised_by_its_cause_and_by_older_servers_wording() -> None:
    current = api_error(504, "Timeout", "Timeout: Too large resource version: 83, current: 4",
                        body=too_large_body())
    assert is_too_large_resource_version(current)
    # Another status code or reason, but the cause: still too large (the cause decides).
    bad_request = json.dumps(status_body(400, "BadRequest", "x", {"causes": [
        {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]}))
    assert is_too_large_resource_version(api_error(400, "BadRequest", "x",
                                                   body=bad_request.encode()))
    # 1.17.0-1.18.5: the cause message without its type; before 1.17: the message only.
    legacy = json.dumps(status_body(504, "Timeout", "Timeout: x", {"causes": [
        {"message": "Too large resource version"}]}))
    assert is_too_large_resource_version(api_error(504, "Timeout", "Timeout: x",
                                                   body=legacy.encode()))
    assert is_too_large_resource_version(api_error(
        504, "Timeout", "Timeout: Too large resource version: 83, current: 4"))
    # Not it: a plain gateway timeout, a 410, a transport failure, an unreadable body.
    assert not is_too_large_resource_version(api_error(
        504, "Timeout", "request timed out", body=json.dumps(status_body(504)).encode()))
    assert not is_too_large_resource_version(Gone(410, "Expired", "too old resource version"))
    assert not is_too_large_resource_version(TransportError("connection reset"))
    assert not is_too_large_resource_version(ApiError(504, body=b"<html>gateway</html>"))


async def test_a_restored_store_is_relisted_and_the_new_parent_fanned_out(
    tmp_path: Path,
) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("a", port=80))
            fake.create(sd("b"))
            await h.until(lambda: all(ready(fake.get("servicedefinitions", CONTROL, n))
                                      for n in ("a", "b")))
            await h.idle()
            informer = h.reconciler.informer
            assert informer is not None and informer.lists == 1
            assert informer.resource_version is not None
            held = int(informer.resource_version)
            restarts = h.metric("fanout_watch_restarts", kind="ServiceDefinition")

            with capture_logs() as logs:
                # etcd restored from a backup older than every parent: the RV goes back, the
                # open watch ends (the API server restarted), and the backup still holds a
                # child of "a" but not "a" itself.
                assert fake.reset_state() < held
                fake.create(orphan_deployment("a"), field_manager="trio-supervisor")  # ours, restored
                fake.create(sd("c", port=9090))
                assert fake.resource_version < held  # the re-watch from `held` is too large
                await h.until(lambda: fake.get("services", APPS, "c") is not None
                              and ready(fake.get("servicedefinitions", CONTROL, "c")) is not None)
                await h.until(lambda: fake.get("deployments", APPS, "a") is None)
                await h.idle()

            assert fake.get("deployments", APPS, "c") is not None
            assert informer.lists == 2  # one relist, no loop
            assert h.reconciler.informer is informer  # never went back to the preflight
            assert h.status.state == "watching" and h.status.last_error_class is None
            assert h.status.objects == 1
            # One relist per informer of the kind (parents, deployments, services), no loop;
            # the watches of other installations' children (deployments, services) relist
            # too once their open stream ends, which may come after this point.
            relists = h.metric("fanout_watch_restarts", kind="ServiceDefinition") - restarts
            assert 3 <= relists <= 5, relists
            # The watch from the old RV was answered with the ERROR event, not a 410.
            stale = [r for r in fake.find_requests("GET", "/servicedefinitions", watch=True)
                     if r.query.get("resourceVersion") == str(held)]
            assert stale and all(r.status == 200 for r in stale)
            # One warning per informer of the kind (the children are watched too).
            warned = [e for e in logs if RESTORED in str(e.get("event"))]
            assert sorted(set(e["resource"] for e in warned)) == [
                "deployments.apps", "servicedefinitions.platform.trio-supervisor.dev",
                "services"]
            assert len(warned) == relists  # one warning per relist
            warned = [e for e in warned if e["resource"].startswith("servicedefinitions")]
            assert warned[0]["log_level"] == "warning"
            assert warned[0]["kind"] == "ServiceDefinition"
            assert warned[0]["resource_version"] == str(held)
            assert "Too large resource version" in warned[0]["error"]
            assert not [e for e in logs if e["log_level"] == "error"]
            assert not [e for e in logs if "back to preflight" in str(e.get("event"))]


async def test_a_too_large_error_response_relists_too(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with harness(tmp_path) as h:
            fake = h.fake
            fake.create(sd("a"))
            await h.until(lambda: fake.get("deployments", APPS, "a") is not None)
            informer = h.reconciler.informer
            assert informer is not None and informer.lists == 1
            # The same Status as an HTTP 504 (as from a path bypassing the watch cache).
            fake.inject("GET", r"/servicedefinitions$", status=504, body=too_large_body(),
                        query_contains="watch=")
            fake.close_watches()
            await h.until(lambda: informer.lists == 2)
            fake.create(sd("b"))
            await h.until(lambda: fake.get("deployments", APPS, "b") is not None)
            assert fake.count("GET", "/servicedefinitions", watch=True, status=504) == 1
            assert h.status.state == "watching" and h.reconciler.informer is informer


async def test_too_large_for_the_rv_a_list_just_gave_backs_off_before_relisting(
    tmp_path: Path,
) -> None:
    """A server contradicting its own list (an API server whose watch cache lags, behind a
    load balancer) must not turn list-watch into a hot loop."""
    tuning = FanoutTuning(
        watch=WatchTuning(timeout_s=30, inactivity_s=1.0, backoff_initial_s=0.2,
                          backoff_max_s=0.4, page_size=50),
        workers=FAST.workers, resync_s=FAST.resync_s,
        requeue_initial_s=FAST.requeue_initial_s, requeue_max_s=FAST.requeue_max_s,
    )

    def every_watch_too_large(fake: Any) -> None:
        fake.inject("GET", r"/servicedefinitions$", status=504, body=too_large_body(),
                    query_contains="watch=", times=3)

    with trio.fail_after(10):
        async with harness(tmp_path, tuning=tuning, before_start=every_watch_too_large) as h:
            fake = h.fake
            await fake.wait_for_watches(1, "servicedefinitions")
            informer = h.reconciler.informer
            assert informer is not None and informer.lists == 4
            refused = fake.find_requests("GET", "/servicedefinitions", watch=True, status=504)
            lists = fake.find_requests("GET", "/servicedefinitions", watch=False)
            assert len(refused) == 3
            for watch in refused:
                relist = next(r for r in lists if r.time > watch.time)
                assert relist.time - watch.time >= 0.1  # half the initial backoff, at least
            fake.create(sd("a"))
            await h.until(lambda: fake.get("deployments", APPS, "a") is not None)
            assert h.status.state == "watching" and h.reconciler.informer is informer
