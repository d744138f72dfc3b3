"""The fan-out's rules on their own: the drift test, child availability, the queue,
the sweep guard, the repair limiter, the token bucket, the [kubernetes] keys and Retry-After."""

from __future__ import annotations

import trio
import trio.testing

from supervisor.configfile import load_text
from supervisor.errors import ConfigError
from supervisor.fanout.childwrites import RepairLimiter
from supervisor.fanout.labels import LINEAGE_SERVICEDEFINITION
from supervisor.fanout.live import LiveChildren, covers, unavailable
from supervisor.fanout.servicedefinition import DEPLOYMENTS, SERVICES
from supervisor.fanout.sweep import SweepGuard
from supervisor.kube.applying import ChildKey, make_desired
from supervisor.kube.client import TokenBucket


def test_covers_ignores_what_the_server_adds_and_sees_what_we_set() -> None:
    want = {"spec": {"replicas": 1, "template": {"spec": {"containers": [
        {"name": "main", "image": "nginx:1.27"}]}}}}
    live = {"status": {"replicas": 1}, "spec": {
        "replicas": 1, "revisionHistoryLimit": 10, "template": {"spec": {
            "dnsPolicy": "ClusterFirst",
            "containers": [{"name": "main", "image": "nginx:1.27",
                            "imagePullPolicy": "IfNotPresent"}]}}}}
    assert covers(live, want)
    live["spec"]["replicas"] = 3  # kubectl scale
    assert not covers(live, want)
    live["spec"]["replicas"] = 1
    live["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "x"})
    assert not covers(live, want)  # a list of ours is ours as a whole
    assert not covers({"spec": {"replicas": True}}, {"spec": {"replicas": 1}})
    assert not covers({}, want)


def test_covers_takes_a_zero_value_the_server_omits_as_the_same() -> None:
    # The server's types omit empty fields (an env var's value ""): never drift.
    want = {"env": [{"name": "EMPTY", "value": ""}, {"name": "MODE", "value": "on"}],
            "replicas": 0, "paused": False, "args": [], "extra": {}}
    assert covers({"env": [{"name": "EMPTY"}, {"name": "MODE", "value": "on"}]}, want)
    assert not covers({"env": [{"name": "EMPTY"}, {"name": "MODE"}]}, want)  # "on" is not
    assert not covers({"env": [{"name": "EMPTY", "value": "x"}, {"name": "MODE",
                                                               "value": "on"}]}, want)
    assert not covers({"env": want["env"], "replicas": 1}, want)  # present and different


def test_availability_of_a_deployment_and_of_other_children() -> None:
    labels = {"a": "b"}
    deployment = make_desired(DEPLOYMENTS, "apps", "web", labels=labels, spec={"replicas": 2})
    service = make_desired(SERVICES, "apps", "web", labels=labels, spec={})
    assert unavailable(service, {"metadata": {}}) is None
    assert unavailable(service, None) == "Service web does not exist"
    live = {"metadata": {"generation": 2},
            "status": {"observedGeneration": 1, "availableReplicas": 2}}
    assert "not observed" in (unavailable(deployment, live) or "")
    live["status"] = {"observedGeneration": 2, "availableReplicas": 1}
    assert unavailable(deployment, live) == "Deployment web: 1/2 replicas available"
    live["status"]["availableReplicas"] = 2
    assert unavailable(deployment, live) is None


def test_live_children_enqueue_their_parent_and_keep_the_newer_object() -> None:
    queued: list[str] = []
    live = LiveChildren((DEPLOYMENTS,), LINEAGE_SERVICEDEFINITION, queued.append)

    def obj(rv: str, replicas: int) -> dict[str, object]:
        return {"metadata": {"name": "web", "resourceVersion": rv,
                             "labels": {LINEAGE_SERVICEDEFINITION: "web"}},
                "spec": {"replicas": replicas}}

    live.replace(DEPLOYMENTS, [obj("5", 1)])
    assert live.synced and queued == []  # the first list enqueues nothing by itself
    live.put(DEPLOYMENTS, obj("9", 1))  # what our own apply returned
    live.observe(DEPLOYMENTS, obj("7", 3))  # an older event arriving late: not held
    assert live.get(ChildKey("deployments", "web"))["spec"]["replicas"] == 1  # type: ignore[index]
    live.observe(DEPLOYMENTS, obj("11", 3))
    assert live.get(ChildKey("deployments", "web"))["spec"]["replicas"] == 3  # type: ignore[index]
    live.forget(DEPLOYMENTS, "web")
    assert live.of_parent("web") == set()
    assert queued == ["web", "web"]  # the newer event and the delete; not the stale one


def test_a_write_s_answer_arriving_after_the_child_s_delete_event_is_not_held() -> None:
    # A child deleted right after our apply: its ADDED and DELETED events are handled
    # before the apply's answer, and a put() that held the deleted object again would
    # never see an event remove it, so nothing would repair the child.
    queued: list[str] = []
    live = LiveChildren((DEPLOYMENTS,), LINEAGE_SERVICEDEFINITION, queued.append)
    key = ChildKey("deployments", "web")

    def obj(rv: str) -> dict[str, object]:
        return {"metadata": {"name": "web", "resourceVersion": rv,
                             "labels": {LINEAGE_SERVICEDEFINITION: "web"}}}

    live.replace(DEPLOYMENTS, [])
    live.observe(DEPLOYMENTS, obj("6"))  # ADDED: our apply's own event
    live.forget(DEPLOYMENTS, "web")  # DELETED by someone else
    live.put(DEPLOYMENTS, obj("6"))  # the apply's answer, late
    assert live.get(key) is None
    live.put(DEPLOYMENTS, obj("9"))  # made again later: held
    assert live.get(key) is not None


def test_the_sweep_guard() -> None:
    guard = SweepGuard()
    assert guard.allow(5, 6, {"a"})  # a handful is always allowed
    assert guard.allow(10, 20, {"a"})  # half is allowed
    assert not guard.allow(11, 20, {"a"})  # more than half and more than a handful
    assert guard.holding
    assert not guard.allow(11, 20, {"a", "b"})  # another parent list: still refused
    assert guard.allow(11, 20, {"a", "b"})  # the same list seen again: allowed
    assert not guard.holding and guard.refusals == 2


def test_a_deferred_repair_keeps_its_time_while_it_waits() -> None:
    # The parent's RepairDeferred status names that time: it must not move with "now",
    # or every reconcile during the deferral would write the status again.
    limiter = RepairLimiter(burst=3, window_s=60.0, max_s=60.0)
    for t in (0.0, 0.1, 0.2):
        assert limiter.not_before("web", t) == t  # the burst: at once
        limiter.record("web", t)
    assert limiter.not_before("web", 0.3) == 1.2  # 1 s after the last repair
    assert limiter.not_before("web", 0.9) == 1.2
    assert limiter.not_before("web", 1.2) == 1.2  # due: at once
    limiter.record("web", 1.2)
    assert limiter.not_before("web", 1.3) == 3.2  # then 2 s


async def test_the_token_bucket_paces_after_the_burst(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bucket = TokenBucket(qps=10, burst=5)
    start = trio.current_time()
    for _ in range(5):
        await bucket.acquire()
    assert trio.current_time() == start  # the burst goes at once
    for _ in range(10):
        await bucket.acquire()
    assert abs(trio.current_time() - start - 1.0) < 1e-6  # then 10 a second
    await trio.sleep(10)  # refills up to the burst, no more
    again = trio.current_time()
    for _ in range(6):
        await bucket.acquire()
    assert abs(trio.current_time() - again - 0.1) < 1e-6


def test_kubernetes_config_keys_have_their_defaults_and_bounds() -> None:
    defaults = load_text("").kubernetes
    assert defaults.installation is None
    assert defaults.installation_label == defaults.control_namespace  # unset: docs/kubernetes.md
    # The limiter is a safety net: at 200/400 it set the pace of a 1,000-parent bulk.
    assert (defaults.resync_s, defaults.qps, defaults.burst) == (600.0, 1000.0, 2000)
    mine = load_text('[kubernetes]\ncontrol_namespace = "ctl"\n').kubernetes
    assert mine.installation_label == "ctl"
    named = load_text('[kubernetes]\ninstallation = "prod-eu"\n').kubernetes
    assert named.installation_label == "prod-eu"
    for bad in ('installation = "not a label value!"', "resync_s = 0", "burst = 0"):
        try:
            load_text(f"[kubernetes]\n{bad}\n")
        except ConfigError as exc:
            assert "$.kubernetes." in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_retry_after_is_a_finite_number_of_seconds_or_nothing() -> None:
    # "inf" (or "nan") parsed as a float would make a 429's requeue wait forever.
    import httpx

    from supervisor.kube.wire import retry_after

    def answer(value: str) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": value})

    assert retry_after(answer("3")) == 3.0
    assert retry_after(answer("-2")) == 0.0
    for bad in ("inf", "Infinity", "nan", "soon", "Wed, 99 Foo 2015 07:28:00 GMT",
                "Wed, 21 Oct 99999999999 07:28:00 GMT"):
        assert retry_after(answer(bad)) is None, bad
    assert retry_after(httpx.Response(429)) is None


def test_retry_after_as_an_http_date_is_the_seconds_until_then_capped() -> None:
    # RFC 9110 allows an HTTP-date (a proxy in front of the API server may send one);
    # ignored, every parent retried on its own short backoff against a server that
    # asked for a pause.
    import datetime as dt
    import email.utils

    import httpx

    from supervisor.kube.wire import MAX_RETRY_AFTER_S, retry_after

    def at(seconds_from_now: float) -> httpx.Response:
        when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds_from_now)
        return httpx.Response(429, headers={
            "Retry-After": email.utils.format_datetime(when, usegmt=True)})

    ten = retry_after(at(10.5))
    assert ten is not None and 9.0 <= ten <= 10.5
    assert retry_after(at(-3600)) == 0.0
    assert retry_after(at(86400)) == MAX_RETRY_AFTER_S
    assert retry_after(httpx.Response(429, headers={
        "Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
