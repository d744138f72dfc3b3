"""The metrics an alerting package relies on: build info, fan-out state, no _created."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from supervisor import __version__
from supervisor.fanout.status import FanoutStatus
from supervisor.telemetry import Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_build_info_carries_the_version() -> None:
    found = samples(Metrics(process=False))
    assert found[("supervisor_build_info", (("version", __version__),))] == 1.0


def test_no_created_series() -> None:
    text = generate_latest(Metrics(process=False).registry).decode()
    assert "_created" not in text
    assert "supervisor_revision_rejections_total" in text


def test_fanout_state_is_disabled_until_tracked_then_follows_the_status() -> None:
    metrics = Metrics(process=False)
    found = samples(metrics)
    for kind in ("ServiceDefinition", "Workflow"):
        key = ("supervisor_fanout_state", (("kind", kind), ("state", "disabled")))
        assert found[key] == 1.0
        assert found[("supervisor_fanout_state", (("kind", kind), ("state", "watching")))] == 0
    statuses = {"ServiceDefinition": FanoutStatus(state="preflight")}
    metrics.track_fanout(statuses)
    found = samples(metrics)
    assert found[("supervisor_fanout_state",
                  (("kind", "ServiceDefinition"), ("state", "preflight")))] == 1.0
    statuses["ServiceDefinition"].state = "watching"  # read live at scrape time
    found = samples(metrics)
    assert found[("supervisor_fanout_state",
                  (("kind", "ServiceDefinition"), ("state", "watching")))] == 1.0
    assert found[("supervisor_fanout_state",
                  (("kind", "ServiceDefinition"), ("state", "preflight")))] == 0.0
