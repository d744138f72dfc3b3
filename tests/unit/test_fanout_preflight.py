"""The fan-out preflight on virtual time, through a fake of our own client seam.

The fakes implement :class:`supervisor.fanout.preflight.ListClient` (the one
call a preflight makes). Their failures are the real ones: an
:class:`~supervisor.kube.errors.ApiError` as the client raises for an error
status, and a :class:`~supervisor.kube.errors.SchemaSkew` produced by the
client's own :func:`~supervisor.kube.client.decode` on a skewed body.
"""

from __future__ import annotations

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
from supervisor.kube.models import KindSpec, ObjectList, Resource
from supervisor.telemetry import Metrics

T = TypeVar("T")

RETRY_S = 300.0
KIND = KindSpec(SERVICEDEFINITIONS, ServiceDefinition)


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
        self.calls.append({"resource": resource, "namespace": namespace, "limit": limit})
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
    # items holds a value that cannot decode into a ServiceDefinition (a bare string).
    return FakeLister(b'{"kind":"ServiceDefinitionList","items":["not an object"]}')


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
    assert lister.calls == [{"resource": SERVICEDEFINITIONS, "namespace": "ns", "limit": 1}]


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


async def test_retries_every_retry_s_until_serveable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    boom = api_error(403, "Forbidden", "no role")
    ok = b'{"items":[]}'
    lister = FakeLister(boom, boom, ok, repeat_last=False)
    start = trio.current_time()
    await await_watchable(lister, KIND, "apps", retry_s=RETRY_S)
    assert len(lister.calls) == 3
    assert trio.current_time() - start == pytest.approx(2 * RETRY_S)


async def test_skew_logs_an_error_naming_the_crd_fix_on_every_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    status = FanoutStatus()
    metrics = Metrics(process=False)
    with capture_logs() as logs:
        with trio.move_on_after(2.5 * RETRY_S):
            await await_watchable(skewed(), KIND, "ns", retry_s=RETRY_S, status=status,
                                  metrics=metrics, kind="ServiceDefinition")
    lines = [e for e in logs if e.get("error_class")]
    assert len(lines) == 3
    for line in lines:
        assert line["log_level"] == "error"
        assert line["kind"] == "ServiceDefinition"
        assert line["error_class"] == reasons.SCHEMA_SKEW
        assert "kubectl apply -k manifests/crds" in line["event"]
        assert "$.items[0]" in line["error"]
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
    assert "manifests/apps-namespace" in line["event"]
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
