"""Every Prometheus metric of the daemon, in one place."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol, TypeVar, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from supervisor import __version__, reasons
from supervisor.status_doc import FanoutState

__all__ = ["Metrics", "RevisionFacts"]


class RevisionFacts(Protocol):
    """What the revision gauges read (the convergence loop's status report)."""

    @property
    def desired(self) -> int | None: ...
    @property
    def active(self) -> int | None: ...
    @property
    def generation(self) -> int: ...
    @property
    def source(self) -> str | None: ...
    @property
    def control_plane_up(self) -> bool: ...
    @property
    def lag_s(self) -> float: ...
    @property
    def statement_expires_at(self) -> float: ...


def _is(read: Callable[[], str], state: str) -> Callable[[], float]:
    """1 while ``read()`` answers ``state``, else 0: a state gauge, read at every scrape."""
    return lambda: 1.0 if read() == state else 0.0


NS = "supervisor"
KINDS = reasons.FANOUT_KINDS
_M = TypeVar("_M", Counter, Gauge, Histogram)


def _metric(cls: type[_M], registry: CollectorRegistry, name: str, doc: str,
            labels: Mapping[str, tuple[str, ...]] | None = None, **options: Any) -> _M:
    """A metric of ``registry``; ``labels`` maps each label to the values pre-initialised
    (every combination: a rate() over one never seen is 0, not absent)."""
    labels = labels or {}
    made = cls(name, doc, list(labels), namespace=NS, registry=registry, **options)
    if labels:
        for values in itertools.product(*labels.values()):
            made.labels(*values)
    return made


class Metrics:
    """The daemon's metrics, on a ``CollectorRegistry`` of their own (tests make their own).

    Names follow Prometheus conventions (``_total`` counters, ``_seconds`` units).
    Revision ids are gauge *values*, never labels. Every label value comes from
    :mod:`supervisor.reasons`, pre-initialised to 0: a rate() over an unseen reason is 0.

    No ``_created`` series: they would double the series count for a timestamp nobody
    alerts on (``disable_created_metrics`` is process-wide).
    ``supervisor_build_info{version}`` is always 1.
    """
    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        counter = partial(_metric, Counter, r)
        gauge = partial(_metric, Gauge, r)
        histogram = partial(_metric, Histogram, r)
        self.build_info = gauge(
            "build_info", "Always 1; the version of this build in the label.", {"version": ()})
        self.build_info.labels(__version__).set(1)
        self.fanout_state = gauge(
            "fanout_state",
            "1 for each fan-out kind's current state (disabled, preflight, watching).",
            {"kind": KINDS, "state": get_args(FanoutState)})
        self.track_fanout({})
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)

        # Convergence.
        self.convergence_attempts = counter(
            "convergence_attempts", "Convergence attempts by outcome.",
            {"outcome": reasons.OUTCOMES})
        self.convergence_duration = histogram(
            "convergence_duration_seconds", "Duration of one convergence attempt.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.revision_rejections = counter(
            "revision_rejections", "Refused candidate revisions by reason.",
            {"reason": reasons.REVISION_REASONS})
        self.desired_revision = gauge(
            "desired_revision", "The control plane's desired revision id (0 = none).")
        self.active_revision = gauge(
            "active_revision", "The revision id of the active snapshot (0 = none).")
        self.active_generation = gauge(
            "active_generation", "The generation of the active snapshot.")
        self.convergence_lag = gauge(
            "convergence_lag_seconds", "Time since desired first differed from active.")
        self.control_plane_up = gauge(
            "control_plane_up",
            "1 when the control plane answered the last read (refusals included); 0 when "
            "it could not be asked.")
        self.statement_expires_at = gauge(
            "statement_expires_at_seconds",
            "Unix time the root's signed statement being served expires (0 = none).")
        self.serving_last_known_good = gauge(
            "serving_last_known_good",
            "1 while the active snapshot came from the last-known-good cache, not the "
            "control plane.")
        self.sink_write_failures = counter(
            "sink_write_failures", "Failed snapshot-file or cache writes.", {"sink": reasons.SINKS})
        self.sink_state = gauge(
            "sink_state",
            "1 for each side sink's current state (ok, failing: from a refused write until a "
            "write succeeds, disabled: not configured).",
            {"sink": reasons.SINKS, "state": reasons.SINK_STATES})
        self.hook_runs = counter(
            "hook_runs", "Runs of the reload hook ([hook].command) by outcome.",
            {"outcome": reasons.HOOK_OUTCOMES})
        self.last_known_good_events = counter(
            "last_known_good_events", "Last-known-good cache exports, restores, refusals.",
            {"event": reasons.LKG_EVENTS})

        # LISTEN.
        self.listen_connected = gauge(
            "listen_connected", "1 while the LISTEN connection is established.")
        self.listen_notifications = counter(
            "listen_notifications", "Notifications received on the LISTEN channel.")
        self.listen_reconnects = counter(
            "listen_reconnects", "LISTEN connection (re)connect attempts that failed.")
        self.listen_wakeups_held = counter(
            "listen_wakeups_held",
            "Notification wake-ups held back by [control_plane].notify_min_interval_s "
            "(notifications arriving faster: a storm).")

        # Fan-out.
        self.fanout_preflight_failures = counter(
            "fanout_preflight_failures", "Failed fan-out preflights by kind and error class.",
            {"kind": KINDS, "error_class": reasons.FANOUT_ERROR_CLASSES})
        self.fanout_applies = counter("fanout_applies", "Fan-out child writes by kind and result.",
                                      {"kind": KINDS, "result": reasons.FANOUT_APPLY_RESULTS})
        self.fanout_errors = counter(
            "fanout_errors", "Failed fan-out lists, watches and child writes by kind and class.",
            {"kind": KINDS, "class": reasons.FANOUT_ERROR_CLASSES})
        self.fanout_watch_restarts = counter(
            "fanout_watch_restarts", "Watch restarts (relists, reconnects) by kind.",
            {"kind": KINDS})
        self.fanout_objects = gauge(
            "fanout_objects", "Parent objects currently watched, by kind.", {"kind": KINDS})

        # Fan-out controller: reconcile durations, queue depth, requeues,
        # drift repairs, refused sweeps, Events that could not be recorded.
        self.fanout_reconcile_duration = histogram(
            "fanout_reconcile_duration_seconds", "Duration of one parent reconcile.",
            {"kind": KINDS, "result": reasons.FANOUT_RECONCILE_RESULTS},
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.fanout_queue_depth = gauge(
            "fanout_queue_depth", "Parents waiting in the work queue, by kind.", {"kind": KINDS})
        self.fanout_requeues = counter(
            "fanout_requeues", "Parents requeued after a failed reconcile, by kind and cause.",
            {"kind": KINDS, "cause": reasons.FANOUT_REQUEUE_CAUSES})
        self.fanout_drift_repairs = counter(
            "fanout_drift_repairs", "Children repaired after an out-of-band change, by kind.",
            {"kind": KINDS})
        self.fanout_sweeps_refused = counter(
            "fanout_sweeps_refused", "Orphan sweeps refused by the sweep guard, by kind.",
            {"kind": KINDS})

        # Supervision and admin.
        self.child_restarts = counter(
            "child_restarts", "Restarts of supervised children.", {"child": ()})
        self.stream_clients = gauge("stream_clients", "Connected live-stream WebSocket clients.")
        self.stream_dropped = counter(
            "stream_dropped_clients", "Stream clients closed for falling behind.")
        self.admin_connections = gauge(
            "admin_connections", "Admin API connections held (stream clients included).")
        self.admin_connection_limit = gauge(
            "admin_connection_limit",
            "Admin API connections held at most (from RLIMIT_NOFILE minus a reserve).")
        self.admin_connections_shed = counter(
            "admin_connections_shed",
            "Admin connections given up at the limit: an idle one closed (evicted) or a new "
            "one refused (refused).",
            {"how": ("evicted", "refused")})

        self.followers = gauge(
            "followers", "Direct followers listed by GET /v1/followers, by the state they "
            "named.", {"state": reasons.FOLLOWER_STATES})

    def track_followers(self, count: Callable[[str], int]) -> None:
        """Read ``supervisor_followers{state}`` from ``count(state)`` at every scrape."""
        for state in reasons.FOLLOWER_STATES:
            self.followers.labels(state).set_function(partial(count, state))

    def follow_revision(self, status: RevisionFacts) -> None:
        """Read the revision gauges from ``status`` at every scrape (its writer is the loop)."""

        def lag() -> float:
            try:
                return status.lag_s
            except RuntimeError:  # read outside the event loop's thread: no clock
                return math.nan

        self.desired_revision.set_function(lambda: status.desired or 0)
        self.active_revision.set_function(lambda: status.active or 0)
        self.active_generation.set_function(lambda: status.generation)
        self.convergence_lag.set_function(lag)
        self.control_plane_up.set_function(lambda: 1 if status.control_plane_up else 0)
        self.serving_last_known_good.set_function(
            lambda: 1 if status.source == "last_known_good" else 0)
        self.statement_expires_at.set_function(lambda: status.statement_expires_at)

    def follow_sinks(self, sink_state: Callable[[str], str]) -> None:
        """Read ``supervisor_sink_state`` from ``sink_state(sink)`` (the side sinks' status)
        at every scrape."""
        for sink, state in itertools.product(reasons.SINKS, reasons.SINK_STATES):
            read = partial(sink_state, sink)
            self.sink_state.labels(sink, state).set_function(_is(read, state))

    def track_fanout(self, statuses: Mapping[str, Any]) -> None:
        """Export ``supervisor_fanout_state{kind, state}`` from ``statuses`` (kind -> FanoutStatus).

        1 for each kind's current state, 0 for the others, read at scrape time.
        """

        def current(kind: str) -> str:
            return str(getattr(statuses.get(kind), "state", "disabled"))

        for kind, state in itertools.product(KINDS, get_args(FanoutState)):
            self.fanout_state.labels(kind, state).set_function(_is(partial(current, kind), state))
