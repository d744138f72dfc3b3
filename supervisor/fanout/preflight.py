"""The preflight every fan-out watcher runs before it watches: :func:`await_watchable`.

Operators: docs/operations.md, "The fan-out controller"; docs/log-events.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, Protocol, TypeVar

import msgspec
import trio

from supervisor import reasons
from supervisor.backoff import Backoff
from supervisor.fanout.status import FanoutStatus
from supervisor.kube.errors import (
    ApiError,
    DecodeError,
    KubeError,
    NotFound,
    TimedOut,
    TooLargeResponse,
    TooManyRequests,
)
from supervisor.kube.models import ObjectList, Resource
from supervisor.logs import get_logger
from supervisor.telemetry import Metrics
from supervisor.wakeup import Wakeup

__all__ = [
    "ListClient",
    "await_watchable",
    "await_watchable_cancellable",
    "classify_watch_error",
    "failure_class",
]

T = TypeVar("T")

log = get_logger("fanout.preflight")

ErrorClass = Literal["schema_skew", "namespace_or_rbac_unready", "child_api_missing"]

CRDS_FIX = "kubectl apply -k manifests/crds"
NAMESPACE_FIX = "manifests/apps-namespace"
FIRST_RETRY_S = 1.0


class ListClient(Protocol):
    """The one client call a preflight makes (``KubeClient`` satisfies it)."""

    async def list(self, resource: Resource, namespace: str, item_type: type[T], *,
                   limit: int) -> ObjectList[T]: ...


def classify_watch_error(exc: BaseException) -> ErrorClass:
    """``schema_skew`` when a body failed to decode into the expected type, else unready.

    The two look alike and need different fixes; this is the only place that decides.
    A :class:`~supervisor.kube.errors.DecodeError` (:class:`~supervisor.kube.errors.SchemaSkew`
    too) means the server answered and we could not read it. The installed CRD's
    schema differs from this build's, which never heals by itself. So it is logged at
    **error** at every retry, naming ``kubectl apply -k manifests/crds``. It keeps the
    retry cadence rather than ending the daemon: the loop and the other watchers keep
    serving. Anything else (an HTTP error status, a transport failure, a configuration
    that does not load) is ``namespace_or_rbac_unready``: the apps namespace or its
    RBAC is not there yet, or the server unreachable. Self-healing, so at **warning**,
    naming ``manifests/apps-namespace``.
    """
    if isinstance(exc, DecodeError):
        return reasons.SCHEMA_SKEW
    return reasons.NAMESPACE_OR_RBAC_UNREADY  # child_api_missing needs discovery: _report


def failure_class(exc: KubeError) -> str:
    """The ``last_error_class`` of a list, watch or write that failed once running.

    ``timeout`` (a deadline passed), ``server_error`` (5xx), ``throttled`` (429),
    ``too_large`` (a body or watch line over its bound); else as
    :func:`classify_watch_error`.
    """
    if isinstance(exc, TimedOut):
        return reasons.TIMEOUT
    if isinstance(exc, TooLargeResponse):
        return reasons.TOO_LARGE
    if isinstance(exc, TooManyRequests):
        return reasons.THROTTLED
    if isinstance(exc, ApiError) and exc.status >= 500:
        return reasons.SERVER_ERROR
    return classify_watch_error(exc)


def _report(exc: KubeError, resource: Resource, error_class: ErrorClass, kind: str,
            namespace: str, retry_s: float) -> None:
    """Log one failed attempt, at error when no retry heals it, with the fix to apply."""
    context = {"kind": kind, "error_class": error_class, "resource": str(resource),
               "namespace": namespace, "error": str(exc), "retry_s": retry_s}
    if error_class == reasons.CHILD_API_MISSING:
        hint = (" (batch/v1 CronJob is served from Kubernetes 1.21)" if (resource.group,
                resource.version, resource.plural) == ("batch", "v1", "cronjobs") else "")
        fix = (f"run against an API server that serves {resource.api_version}"
               f" {resource.plural}{hint}")
        log.error("fan-out child API not served; retrying", detail=
                  f"the API server does not serve {resource.api_version} {resource.plural} (a"
                  f" child resource of {kind}); no manifest fixes this: {fix};"
                  " retrying", fix=fix, **context)
    elif error_class == reasons.SCHEMA_SKEW:
        if path := getattr(exc, "path", ""):
            context["path"] = path
        log.error("fan-out watch response failed to decode; retrying", detail=
                  "the installed CRD schema differs from the one this build reads (schema"
                  " skew, not a namespace or RBAC problem); apply the current CRDs with"
                  f" `{CRDS_FIX}`; retrying", fix=CRDS_FIX, **context)
    else:
        log.warning("fan-out watch not available yet; retrying", detail=
                    "(apps namespace or its RBAC not provisioned, CRDs missing, or the API"
                    f" server unreachable?); apply {NAMESPACE_FIX}; retrying",
                    fix=NAMESPACE_FIX, **context)


async def _not_served(exc: KubeError, resource: Resource,
                      is_served: Callable[[Resource], Awaitable[bool]] | None) -> bool:
    """A 404 that discovery confirms: the server does not serve ``resource`` at all."""
    if is_served is None or not isinstance(exc, NotFound):
        return False
    try:
        return not await is_served(resource)
    except KubeError:
        return False  # discovery itself failed: keep the ordinary classification


async def await_watchable(
    client: ListClient,
    resource: Resource,
    namespace: str,
    *,
    retry_s: float,
    kind: str | None = None,
    status: FanoutStatus | None = None,
    metrics: Metrics | None = None,
    wakeup: Wakeup | None = None,
    is_served: Callable[[Resource], Awaitable[bool]] | None = None,
) -> None:
    """Return once a one-item list of ``resource`` in ``namespace`` succeeds.

    Until then the watcher is dormant, not failing: ``state="preflight"`` with
    ``last_error_class`` set. Each failed attempt is classified
    (:func:`classify_watch_error`), logged with ``kind`` and ``error_class``, and
    counted in ``fanout_preflight_failures{kind,error_class}``. The items are not
    decoded here: the informer decodes them one by one, skipping an undecodable
    one, so one bad object never holds its kind in the preflight. Only an
    undecodable list envelope is a preflight's schema skew. A 404 that discovery
    confirms (``is_served``) is ``child_api_missing`` (kube-apiserver 1.20 has no
    ``batch/v1`` CronJob), at **error**, naming the API: no manifest of ours fixes it.

    ``kind`` is the fan-out kind named in logs and metrics (default: the resource's
    own kind). Retries start after :data:`FIRST_RETRY_S` (or ``retry_s`` if smaller)
    and double up to ``retry_s`` (``[kubernetes].preflight_retry_s``). So a CRD or Role
    applied just after start is noticed at once. ``wakeup`` (SIGHUP) ends a wait early
    and restarts that schedule. Cancel with an enclosing cancel scope.
    """
    label = kind or resource.kind
    if status is not None:
        status.state = "preflight"
    backoff = Backoff(min(FIRST_RETRY_S, retry_s), retry_s, jitter=(1.0, 1.0))
    while True:
        # Read before the attempt: a wake-up during it ends the delay after it.
        seen = wakeup.count if wakeup is not None else 0
        try:
            # Items stay raw: the informer decodes (and names) them one at a time.
            await client.list(resource, namespace, msgspec.Raw, limit=1)
            return
        except KubeError as error:
            exc = error
        delay = backoff.next()
        error_class: ErrorClass = (reasons.CHILD_API_MISSING
                                   if await _not_served(exc, resource, is_served)
                                   else classify_watch_error(exc))
        if status is not None:
            status.state = "preflight"
            status.last_error_class = error_class
        if metrics is not None:
            metrics.fanout_preflight_failures.labels(label, error_class).inc()
        _report(exc, resource, error_class, label, namespace, round(delay, 3))
        if wakeup is None:
            await trio.sleep(delay)
        elif await wakeup.wait(delay, since=seen):
            backoff.reset()


async def await_watchable_cancellable(
    client: ListClient,
    resource: Resource,
    namespace: str,
    *,
    retry_s: float,
    cancel: trio.Event | trio.CancelScope,
    kind: str | None = None,
    status: FanoutStatus | None = None,
    metrics: Metrics | None = None,
) -> bool:
    """:func:`await_watchable` that gives up when ``cancel`` fires: True if serveable first.

    ``cancel`` is a :class:`trio.Event` (set it to give up) or a fresh
    :class:`trio.CancelScope` (cancel it to give up; this function enters it).
    Either way the wait unwinds at once, from a list in flight or from the
    retry sleep, and returns False.
    """

    if isinstance(cancel, trio.Event) and cancel.is_set():
        return False
    scope = cancel if isinstance(cancel, trio.CancelScope) else trio.CancelScope()

    async def cancel_when_set(event: trio.Event) -> None:
        await event.wait()
        scope.cancel()

    with scope:
        async with trio.open_nursery() as nursery:
            if isinstance(cancel, trio.Event):
                nursery.start_soon(cancel_when_set, cancel)
            await await_watchable(client, resource, namespace, retry_s=retry_s, kind=kind,
                                  status=status, metrics=metrics)
            nursery.cancel_scope.cancel()
        return True
    return False
