"""The fan-out preflight on virtual time, through a fake of our own client seam.

The fakes implement :class:`supervisor.fanout.preflight.ListClient` (the one
call a preflight makes). Their failures are the real ones: an
:class:`~supervisor.kube.errors.ApiError` as the client raises for an error
status, and a :class:`~supervisor.kube.errors.SchemaSkew` produced by the
client's own :func:`~supervisor.kube.client.decode` on a skewed body.
"""

from __future__ import annotations

import itertools
from typing import Any, TypeVar

import msgspec
import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from supervisor import reasons
from supervisor.fanout.preflight import (
    await_watchable,
    await_watchable_cancellable,
    classify_watch_error,
)
from supervisor.fanout.servicedefinition import SERVICEDEFINITIONS, ServiceDefinition
from supervisor.fanout.status import FanoutStatus
from supervisor.kube.client import decode
from supervisor.kube.errors import (
    ApiError,
    DecodeError,
    Forbidden,
    KubeConfigError,
    KubeError,
    NotFound,
    SchemaSkew,
    TransportError,
    api_error,
)
from supervisor.kube.models import ObjectList, Resource
from supervisor.telemetry import Metrics
from supervisor.wakeup import Wakeup

T = TypeVar("T")

RETRY_S = 300.0
KIND = SERVICEDEFINITIONS


class FakeLister:
    """Answers each list from a script: an exception to raise, or a body to decode."""

    def __init__(self, *answers: KubeError | bytes, repeat_last: bool = True) -> None:
        self.answers = list(answers)
        self.repeat_last = repeat_last
        self.calls: list[dict[str, Any]] = []

    async def list(
        self,
        resource: Resource,
        namespace: str,
        item_type: type[T],
        *,
        limit: int | None = None,
        continue_token: str | None = None,
        label_selector: str | None = None,
    ) -> ObjectList[T]:
        await trio.lowlevel.checkpoint()  # a real request is a checkpoint too
        self.calls.append({"resource": resource, "namespace": namespace, "limit": limit,
                           "at": trio.current_time()})
        answer = self.answers[0] if len(self.answers) == 1 and self.repeat_last \
            else self.answers.pop(0)
        if isinstance(answer, KubeError):
            raise answer
        return decode(answer, ObjectList[item_type])  # type: ignore[valid-type]


def erroring() -> FakeLister:
    """An API server that answers every list with a 500 Status."""
    return FakeLister(api_error(500, "InternalError", "boom"))


def listable() -> FakeLister:
    return FakeLister(b'{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"7"},'
                      b'"items":[]}')


def skewed() -> FakeLister:
    # The list envelope itself does not decode (items is not a list): a skew of the
    # preflight. A bad *item* is not: the informer names and skips it.
    return FakeLister(b'{"kind":"ServiceDefinitionList","items":"not a list"}')


async def _run_until_cancel(lister: FakeLister, cancel: trio.Event | trio.CancelScope,
                            **kwargs: Any) -> tuple[bool | None, float]:
    result: list[bool] = []

    async def task() -> None:
        result.append(await await_watchable_cancellable(
            lister, KIND, "ns", retry_s=RETRY_S, cancel=cancel, **kwargs))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(task)
        # Let the first (failing) attempt settle into its retry sleep, then cancel.
        await trio.testing.wait_all_tasks_blocked()
        if isinstance(cancel, trio.Event):
            cancel.set()
        else:
            cancel.cancel()
    return (result[0] if result else None), trio.current_time() - start


# -- the reference's four tests ------------------------------------------------------------


@pytest.mark.parametrize("make_cancel", [trio.Event, trio.CancelScope], ids=["event", "scope"])
async def test_cancellation_during_the_retry_sleep_returns_false_promptly(
    autojump_clock: trio.testing.MockClock, make_cancel: Any
) -> None:
    lister = erroring()
    with trio.fail_after(5):  # virtual seconds: far below one retry interval
        served, elapsed = await _run_until_cancel(lister, make_cancel())
    assert served is False, "cancelled before the watch was ever serveable"
    assert elapsed < 1.0, "must not wait out the retry sleep"
    assert len(lister.calls) == 1


async def test_a_serveable_watch_returns_true_without_ever_sleeping(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lister = listable()
    start = trio.current_time()
    served = await await_watchable_cancellable(lister, KIND, "ns", retry_s=RETRY_S,
                                               cancel=trio.Event())
    assert served is True
    assert trio.current_time() == start
    assert lister.calls == [{"resource": SERVICEDEFINITIONS, "namespace": "ns", "limit": 1,
                             "at": start}]


@pytest.mark.parametrize("make_cancel", [trio.Event, trio.CancelScope], ids=["event", "scope"])
async def test_cancellation_during_a_schema_skew_retry_sleep_returns_false_promptly(
    autojump_clock: trio.testing.MockClock, make_cancel: Any
) -> None:
    lister = skewed()
    status = FanoutStatus()
    with trio.fail_after(5):
        served, elapsed = await _run_until_cancel(lister, make_cancel(), status=status)
    assert served is False
    assert elapsed < 1.0
    assert status.last_error_class == reasons.SCHEMA_SKEW


def test_a_body_decode_failure_classifies_as_schema_skew() -> None:
    with pytest.raises(DecodeError) as malformed:
        decode(b"not json", ObjectList[ServiceDefinition])
    assert classify_watch_error(malformed.value) == reasons.SCHEMA_SKEW
    with pytest.raises(SchemaSkew) as mismatch:
        decode(b'{"items":[{"metadata":{"name":"a"},"spec":{"image":1}}]}',
               ObjectList[ServiceDefinition])
    assert mismatch.value.path == "$.items[0].spec.image"
    assert classify_watch_error(mismatch.value) == reasons.SCHEMA_SKEW


@pytest.mark.parametrize(
    "error",
    [
        api_error(403, "Forbidden", "cannot list"),
        api_error(404, "NotFound", "no such resource"),
        api_error(500, "InternalError", "boom"),
        TransportError("connection refused"),
        KubeConfigError("no kubeconfig"),
    ],
    ids=["403", "404", "500", "transport", "config"],
)
def test_an_api_error_response_classifies_as_namespace_or_rbac_unready(error: KubeError) -> None:
    assert classify_watch_error(error) == reasons.NAMESPACE_OR_RBAC_UNREADY


def test_api_error_subclasses_by_status() -> None:
    assert isinstance(api_error(403), Forbidden)
    assert isinstance(api_error(404), NotFound)
    assert type(api_error(418)) is ApiError


# -- cadence, logs, status, metrics --------------------------------------------------------


async def test_retries_start_near_one_second_and_grow_to_retry_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Retrying every retry_s (300 s) from the first failure would notice a CRD applied
    # just after start only minutes later.
    boom = api_error(403, "Forbidden", "no role")
    ok = b'{"items":[]}'
    lister = FakeLister(*([boom] * 12), ok, repeat_last=False)
    await await_watchable(lister, KIND, "apps", retry_s=RETRY_S)
    times = [call["at"] for call in lister.calls]
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    assert gaps[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(gaps) == RETRY_S  # the configured cadence is the ceiling
    assert gaps[-1] == RETRY_S


async def test_a_wakeup_retries_at_once_and_starts_the_schedule_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    boom = api_error(404, "NotFound", "the server could not find the requested resource")
    lister = FakeLister(*([boom] * 8), b'{"items":[]}', repeat_last=False)
    wakeup = Wakeup()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: await_watchable(lister, KIND, "ns", retry_s=RETRY_S,
                                                   wakeup=wakeup))
        await trio.sleep(100)  # attempts at 0, 1, 3, 7, 15, 31, 63: waiting 64 s now
        assert len(lister.calls) == 7
        woken_at = trio.current_time()
        wakeup.wake()  # SIGHUP
        await trio.testing.wait_all_tasks_blocked()
        assert len(lister.calls) == 8
        assert lister.calls[-1]["at"] == woken_at
        await trio.sleep(1.01)  # and the schedule starts again near 1 s
        assert len(lister.calls) == 9


async def test_a_wakeup_during_an_attempt_is_not_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """SIGHUP while the preflight's request is in flight (the CRD applied just then) must
    still end the wait that follows: the wake-up counts, not only one that finds it asleep."""
    boom = api_error(404, "NotFound", "the server could not find the requested resource")
    wakeup = Wakeup()

    class WokenMidRequest(FakeLister):
        async def list(self, *args: Any, **kwargs: Any) -> Any:
            if len(self.calls) == 2:
                wakeup.wake()  # the operator's SIGHUP, while the third request runs
            return await super().list(*args, **kwargs)

    lister = WokenMidRequest(*([boom] * 4), b'{"items":[]}', repeat_last=False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: await_watchable(lister, KIND, "ns", retry_s=RETRY_S,
                                                   wakeup=wakeup))
        await trio.sleep(3.5)  # attempts at 0, 1, 3, and at once again (not at 7)
        assert [c["at"] for c in lister.calls] == [0.0, 1.0, 3.0, 3.0]


async def test_a_bad_item_does_not_fail_the_preflight(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lister = FakeLister(b'{"items":[{"metadata":{"name":"old"},"spec":{"image":["x"]}}]}')
    status = FanoutStatus()
    with capture_logs() as logs:
        await await_watchable(lister, KIND, "ns", retry_s=RETRY_S, status=status)
    assert len(lister.calls) == 1
    assert not [e for e in logs if e.get("error_class")]


async def test_a_child_api_the_server_does_not_serve_is_its_own_class(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # kube-apiserver 1.20 has no batch/v1 CronJob: telling the operator to apply
    # manifests/apps-namespace cannot help, so the refusal is a class of its own.
    cronjobs = Resource("batch", "v1", "cronjobs", "CronJob")
    lister = FakeLister(api_error(404, "NotFound", "404 page not found"))
    asked: list[Resource] = []

    async def is_served(resource: Resource) -> bool:
        asked.append(resource)
        return False

    status = FanoutStatus()
    metrics = Metrics(process=False)
    with capture_logs() as logs, trio.move_on_after(2.5):
        await await_watchable(lister, cronjobs, "apps",
                              retry_s=RETRY_S, kind="Workflow", status=status,
                              metrics=metrics, is_served=is_served)
    lines = [e for e in logs if e.get("error_class")]
    assert lines and {e["error_class"] for e in lines} == {reasons.CHILD_API_MISSING}
    assert lines[0]["log_level"] == "error"
    assert "batch/v1 cronjobs" in str(lines[0])
    assert "manifests/apps-namespace" not in str(lines[0])
    assert "1.21" in lines[0]["fix"]
    assert asked == [cronjobs] * len(lines)
    assert status.last_error_class == reasons.CHILD_API_MISSING
    assert metrics.registry.get_sample_value(
        "supervisor_fanout_preflight_failures_total",
        {"kind": "Workflow", "error_class": reasons.CHILD_API_MISSING}) == len(lines)

    # A 404 the discovery does not confirm (the resource is served) stays unready.
    async def served(resource: Resource) -> bool:
        return True

    with capture_logs() as logs, trio.move_on_after(0.5):
        await await_watchable(lister, cronjobs, "apps",
                              retry_s=RETRY_S, kind="Workflow", is_served=served)
    assert [e["error_class"] for e in logs if e.get("error_class")] == [
        reasons.NAMESPACE_OR_RBAC_UNREADY]


async def test_skew_logs_an_error_naming_the_crd_fix_on_every_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    status = FanoutStatus()
    metrics = Metrics(process=False)
    with capture_logs() as logs:
        with trio.move_on_after(3.5):  # attempts at 0, 1 and 3 s
            await await_watchable(skewed(), KIND, "ns", retry_s=RETRY_S, status=status,
                                  metrics=metrics, kind="ServiceDefinition")
    lines = [e for e in logs if e.get("error_class")]
    assert len(lines) == 3
    for line in lines:
        assert line["log_level"] == "error"
        assert line["kind"] == "ServiceDefinition"
        assert line["error_class"] == reasons.SCHEMA_SKEW
        assert "kubectl apply -k manifests/crds" in str(line)
        assert "$.items" in line["error"]
        assert line["path"] == "$.items"
    assert status.state == "preflight"
    assert status.last_error_class == reasons.SCHEMA_SKEW
    assert metrics.registry.get_sample_value(
        "supervisor_fanout_preflight_failures_total",
        {"kind": "ServiceDefinition", "error_class": reasons.SCHEMA_SKEW}) == 3


async def test_unready_logs_a_warning_naming_the_apps_namespace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    status = FanoutStatus()
    metrics = Metrics(process=False)
    lister = FakeLister(api_error(403, "Forbidden", "cannot list deployments"),
                        b'{"items":[]}', repeat_last=False)
    with capture_logs() as logs:
        await await_watchable(lister, KIND, "apps", retry_s=RETRY_S, status=status,
                              metrics=metrics, kind="Workflow")
    (line,) = [e for e in logs if e.get("error_class")]
    assert line["log_level"] == "warning"
    assert line["kind"] == "Workflow"
    assert line["error_class"] == reasons.NAMESPACE_OR_RBAC_UNREADY
    assert "manifests/apps-namespace" in str(line)
    assert not [e for e in logs if e["log_level"] == "error"]
    assert status.last_error_class == reasons.NAMESPACE_OR_RBAC_UNREADY
    assert metrics.registry.get_sample_value(
        "supervisor_fanout_preflight_failures_total",
        {"kind": "Workflow", "error_class": reasons.NAMESPACE_OR_RBAC_UNREADY}) == 1


async def test_an_already_set_event_returns_false_without_listing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cancel = trio.Event()
    cancel.set()
    lister = listable()
    assert await await_watchable_cancellable(lister, KIND, "ns", retry_s=RETRY_S,
                                             cancel=cancel) is False
    assert lister.calls == []


async def test_an_outer_cancellation_still_propagates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.move_on_after(10) as outer:
        await await_watchable_cancellable(erroring(), KIND, "ns", retry_s=RETRY_S,
                                          cancel=trio.Event())
    assert outer.cancelled_caught


def test_list_type_is_the_typed_list() -> None:
    # The preflight decodes the typed list: an unknown extra field is not a skew.
    body = (b'{"metadata":{"resourceVersion":"3"},"items":[{"metadata":{"name":"a",'
            b'"managedFields":[]},"spec":{"image":"x","newField":{"a":1}},"extra":true}]}')
    result = decode(body, ObjectList[ServiceDefinition])
    assert result.items[0].spec.image == "x"
    assert result.items[0].spec.replicas == 1
    assert msgspec.to_builtins(result.metadata)["resourceVersion"] == "3"
