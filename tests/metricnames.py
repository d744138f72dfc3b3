"""Every metric name the daemon exports (what an alert or a dashboard may name)."""

from __future__ import annotations

import re

from prometheus_client import generate_latest

from supervisor.fanout.leadership import LeadershipMetrics
from supervisor.telemetry import Metrics


def exported_metric_names() -> set[str]:
    registry = Metrics(process=False).registry
    LeadershipMetrics(registry)  # with [kubernetes].leader_election
    exported = set(re.findall(r"^(\w+)", generate_latest(registry).decode(), re.M))
    # A labelled counter with no child yet (child restarts are pre-initialised by
    # the app, per child) has no sample line: take its name from the family.
    exported |= {f.name + ("_total" if f.type == "counter" else "") for f in registry.collect()}
    return exported
