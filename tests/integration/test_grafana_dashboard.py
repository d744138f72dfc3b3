"""deploy/grafana/trio-supervisor.json: a Grafana dashboard whose every expression names
metrics the daemon exports, on the Prometheus data source chosen at import."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.metricnames import exported_metric_names

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "trio-supervisor.json"


def _targets() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in doc["panels"]
            for target in panel["targets"]]


def test_every_expression_names_an_exported_metric() -> None:
    exported = exported_metric_names()
    targets = _targets()
    assert len(targets) >= 10
    for title, expr in targets:
        used = set(re.findall(r"\b(supervisor_\w+)", expr))
        assert used, (title, expr)
        assert used <= exported, (title, used - exported)


def test_the_dashboard_shows_the_rollout_and_the_build() -> None:
    exprs = " ".join(expr for _, expr in _targets())
    for metric in ("supervisor_desired_revision", "supervisor_active_revision",
                   "supervisor_revision_rejections_total", "supervisor_build_info",
                   "supervisor_control_plane_up", "supervisor_serving_last_known_good"):
        assert metric in exprs, metric


def test_panels_are_laid_out_once_each_on_the_chosen_data_source() -> None:
    doc = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in doc["panels"]]
    assert len(ids) == len(set(ids))
    places = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in doc["panels"]]
    assert len(places) == len(set(places))
    [variable] = doc["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    assert {p["datasource"]["uid"] for p in doc["panels"]} == {f"${{{variable['name']}}}"}
    assert all(t["refId"] for p in doc["panels"] for t in p["targets"])
