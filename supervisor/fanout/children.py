"""The fan-out watchers as supervised children: the app wiring's one entry point.

The app imports it lazily, only when ``[kubernetes].enabled``: it pulls in httpx and the
Kubernetes client (``kubernetes`` itself comes later, at the first request, in a thread).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from supervisor.config import KubernetesConfig
from supervisor.fanout.engine import FanoutEngine, FanoutKind, FanoutTuning
from supervisor.fanout.leadership import LeaderElector, LeadershipMetrics, LeadershipStatus
from supervisor.fanout.servicedefinition import SERVICE_DEFINITION
from supervisor.fanout.status import FanoutStatus
from supervisor.fanout.workflow import WORKFLOW
from supervisor.kube.client import KubeClient
from supervisor.kube.lease import KubeLeases
from supervisor.lifecycle.signals import HupHooks
from supervisor.logs import get_logger
from supervisor.telemetry import Metrics
from supervisor.tree import ChildSpec, Restart
from supervisor.wakeup import Wakeup

__all__ = [
    "CLOSE_TIMEOUT_S",
    "DRAIN_S",
    "KINDS",
    "SharedClient",
    "elected_fanout_child",
    "fanout_children",
    "run_fanout_group",
]

log = get_logger("fanout")

CLOSE_TIMEOUT_S = 2.0
DRAIN_S = FanoutTuning.drain_s
KINDS: tuple[FanoutKind[Any], ...] = (SERVICE_DEFINITION, WORKFLOW)


class SharedClient:
    """A reference-counted :class:`KubeClient`: made on first use, closed after the last.

    The kinds share it: one connection pool, one credential cache, one client-side
    rate limit (``[kubernetes].qps``/``burst``). The close is shielded and bounded by
    ``CLOSE_TIMEOUT_S``, so shutdown never hangs on a dead connection.
    """

    def __init__(self, factory: Callable[[], KubeClient]) -> None:
        self._factory = factory
        self._client: KubeClient | None = None
        self._users = 0

    @asynccontextmanager
    async def use(self) -> AsyncIterator[KubeClient]:
        if self._client is None:
            self._client = self._factory()
        client = self._client
        self._users += 1
        try:
            yield client
        finally:
            self._users -= 1
            if self._users == 0 and self._client is client:
                self._client = None
                # Shielded and bounded: this runs while shutdown cancels us.
                with trio.move_on_after(CLOSE_TIMEOUT_S, shield=True) as scope:
                    await client.aclose()
                if scope.cancelled_caught:
                    log.warning("kubernetes client did not close in time",
                                timeout_s=CLOSE_TIMEOUT_S)


def _factory(config: KubernetesConfig) -> Callable[[], KubeClient]:
    return lambda: KubeClient.from_kubeconfig(config.kubeconfig, qps=config.qps,
                                              burst=config.burst)


async def run_fanout_group(
    config: KubernetesConfig,
    metrics: Metrics,
    statuses: dict[str, FanoutStatus],
    *,
    tuning: FanoutTuning | None = None,
    client_factory: Callable[[], KubeClient] | None = None,
    wakeup: Wakeup | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Every fan-out kind in one nursery, on one client: start and stop them as a group.

    Reports started once every kind has (:meth:`FanoutEngine.run`: before any
    Kubernetes request). Runs until cancelled; cancelling drains and stops
    every kind together. Each run starts fresh (preflight, list, resync, sweep): all
    state is re-read from the API server.
    """
    shared = SharedClient(client_factory or _factory(config))
    async with shared.use() as client, trio.open_nursery() as nursery:
        for kind in KINDS:
            status = statuses.setdefault(kind.kind, FanoutStatus())
            reconciler = FanoutEngine(client, kind, config, metrics, status, tuning, wakeup=wakeup)
            await nursery.start(reconciler.run)
        task_status.started()


def fanout_children(
    config: KubernetesConfig,
    metrics: Metrics,
    statuses: dict[str, FanoutStatus],
    *,
    tuning: FanoutTuning | None = None,
    client_factory: Callable[[], KubeClient] | None = None,
    hup: HupHooks | None = None,
) -> list[ChildSpec]:
    """One supervised child per fan-out kind; fills ``statuses`` (``state="preflight"``).

    The kinds are ``ServiceDefinition`` and ``Workflow``. A child's shutdown timeout
    covers the drain of in-flight writes (``DRAIN_S``) and the client's close.
    ``tuning`` and ``client_factory`` are for tests; production uses a client from
    ``config.kubeconfig``. ``hup``: SIGHUP wakes every waiting preflight, so a CRD or
    Role just applied is picked up at once.
    """
    shared = SharedClient(client_factory or _factory(config))
    wakeup = _prepare(metrics, statuses, hup)
    drain = (tuning or FanoutTuning()).drain_s

    def child(kind: FanoutKind[Any]) -> ChildSpec:
        async def start(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with shared.use() as client:
                engine = FanoutEngine(client, kind, config, metrics, statuses[kind.kind], tuning,
                                      wakeup=wakeup)
                await engine.run(task_status=task_status)

        return ChildSpec(name=f"fanout-{kind.kind.lower()}", start=start,
                         restart=Restart.PERMANENT,
                         shutdown_timeout_s=drain + CLOSE_TIMEOUT_S + 1.0)

    return [child(kind) for kind in KINDS]


def _prepare(metrics: Metrics, statuses: dict[str, FanoutStatus],
             hup: HupHooks | None) -> Wakeup:
    """Every kind's status tracked and ``preflight``; the preflights' wake-up, on SIGHUP."""
    metrics.track_fanout(statuses)
    for kind in KINDS:
        statuses.setdefault(kind.kind, FanoutStatus()).state = "preflight"
    wakeup = Wakeup()
    if hup is not None:
        hup.register("fanout-preflight-wake", wakeup.wake)
    return wakeup


def elected_fanout_child(
    config: KubernetesConfig,
    metrics: Metrics,
    statuses: dict[str, FanoutStatus],
    leadership: LeadershipStatus,
    identity: str,
    *,
    on_change: Callable[[LeadershipStatus], None] | None = None,
    tuning: FanoutTuning | None = None,
    client_factory: Callable[[], KubeClient] | None = None,
    lease_client_factory: Callable[[], KubeClient] | None = None,
    hup: HupHooks | None = None,
) -> ChildSpec:
    """One supervised child: the leader election, running the fan-out group while leading.

    With ``[kubernetes].leader_election`` the app uses this, named ``fanout``, in place
    of :func:`fanout_children` (:mod:`supervisor.fanout.leadership`).

    The Lease has its own client, with no client-side rate limit: child writes queued
    behind the fan-out's token bucket must never delay a renewal. The group's drain is
    at most half the gap between the renew deadline and the lease duration. So writes
    in flight when leadership is lost end before the lease can expire for the others.
    While standing by, every kind reports ``preflight`` (dormant: waiting for
    leadership).
    """
    wakeup = _prepare(metrics, statuses, hup)
    leader_metrics = LeadershipMetrics(metrics.registry)
    gap = config.lease_duration_s - config.renew_deadline_s
    base = tuning or FanoutTuning()
    group_tuning = dataclasses.replace(base, drain_s=min(base.drain_s, gap / 2))
    lease_client = SharedClient(lease_client_factory or (
        lambda: KubeClient.from_kubeconfig(config.kubeconfig)))

    async def lead() -> None:
        try:
            await run_fanout_group(config, metrics, statuses, tuning=group_tuning,
                                   client_factory=client_factory, wakeup=wakeup)
        finally:
            for status in statuses.values():
                status.state = "preflight"

    async def start(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with lease_client.use() as client:
            leases = KubeLeases(client, config.control_namespace, config.lease_name, identity)
            elector = LeaderElector(
                leases, identity=identity, lease_duration_s=config.lease_duration_s,
                renew_deadline_s=config.renew_deadline_s,
                retry_period_s=config.retry_period_s, status=leadership,
                metrics=leader_metrics, on_change=on_change)
            await elector.run(lead, task_status=task_status)

    return ChildSpec(
        name="fanout",
        start=start,
        restart=Restart.PERMANENT,
        shutdown_timeout_s=group_tuning.drain_s + 2 * CLOSE_TIMEOUT_S + 2.0 + 1.0,
    )
