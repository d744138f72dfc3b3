"""deploy/prometheus/: the alerting rules, their unit tests, the scrape job, the ServiceMonitor.

promtool (Debian's ``prometheus`` package) checks and unit-tests the rules; without it
those tests skip, naming it, and under ``SUPERVISOR_TEST_REQUIRE_ALL=1`` (``.ci/run``,
which installs it) they fail instead (tests/needs.py).
Run as a module, this file prints ``prometheusrule.yaml`` regenerated from
``rules.yml``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import generate_latest

from supervisor.convergence.side_sinks import SinkStatus
from supervisor.telemetry import Metrics
from tests import needs
from tests.metricnames import exported_metric_names

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "deploy" / "prometheus"
RULES = PROM / "rules.yml"
HEADER = (
    "# The alerting rules of rules.yml for the Prometheus Operator. Generated from rules.yml:\n"
    "# edit rules.yml, then regenerate (tests/integration/test_prometheus.py fails while they "
    "differ):\n"
    "#   python -m tests.integration.test_prometheus > deploy/prometheus/prometheusrule.yaml\n"
)


def prometheus_rule() -> str:
    rules = yaml.safe_load(RULES.read_text())
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "trio-supervisor", "namespace": "trio-supervisor",
                        "labels": {"app.kubernetes.io/name": "trio-supervisor",
                                   "app.kubernetes.io/part-of": "trio-supervisor"}},
           "spec": rules}
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=100)


def promtool() -> str:
    return needs.program("promtool", "apt-get install prometheus; .ci/run installs it")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=60,
                            check=False)
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result


def test_promtool_check_rules() -> None:
    out = run(promtool(), "check", "rules", "rules.yml", cwd=PROM).stdout
    assert "SUCCESS: 9 rules found" in out


def test_promtool_test_rules() -> None:
    out = run(promtool(), "test", "rules", "rules.test.yml", cwd=PROM).stdout
    assert "SUCCESS" in out


def test_promtool_check_scrape_config(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    text = (PROM / "prometheus.yml").read_text()
    assert "credentials_file: /etc/prometheus/trio-supervisor.token" in text
    (tmp_path / "prometheus.yml").write_text(
        text.replace("/etc/prometheus/trio-supervisor.token", str(token)))
    shutil.copy(RULES, tmp_path / "rules.yml")
    out = run(promtool(), "check", "config", "prometheus.yml", cwd=tmp_path).stdout
    assert "is valid prometheus config file syntax" in out


def test_every_alert_has_a_test_and_every_test_a_firing_case() -> None:
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
              for r in g["rules"]}
    tests = yaml.safe_load((PROM / "rules.test.yml").read_text())["tests"]
    firing = {case["alertname"] for t in tests for case in t["alert_rule_test"]
              if case.get("exp_alerts")}
    assert alerts == firing


def test_rules_use_only_metrics_the_daemon_exports() -> None:
    exported = exported_metric_names()
    used = set(re.findall(r"\b(supervisor_\w+)", RULES.read_text()))
    assert used, "the rules name supervisor metrics"
    assert used <= exported, used - exported


def test_prometheusrule_is_rules_yml() -> None:
    assert (PROM / "prometheusrule.yaml").read_text() == prometheus_rule()


def _objects(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def test_servicemonitor_selects_the_admin_service_with_the_token() -> None:
    [monitor] = _objects(PROM / "servicemonitor.yaml")
    services = _objects(REPO / "deploy" / "kubernetes" / "service.yaml")
    # Exactly one Service is scraped: the headless one beside it would scrape each pod twice.
    [service] = [s for s in services if monitor["spec"]["selector"]["matchLabels"].items()
                 <= s["metadata"]["labels"].items()]
    assert service["metadata"]["name"] == "trio-supervisor-admin" and len(services) == 2
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    secret = endpoint["authorization"]["credentials"]
    deployment = next(d for d in _objects(REPO / "deploy" / "kubernetes" / "statefulset.yaml")
                      if d["kind"] == "StatefulSet")
    secrets = {v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]
               ["volumes"] if "secret" in v}
    assert secret["name"] in secrets and secret["key"] == "token"
    # rules.yml's TrioSupervisorDown selects job="trio-supervisor": the job label
    # comes from the Service's app.kubernetes.io/name label.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "trio-supervisor"
    kustomization = yaml.safe_load((PROM / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {"servicemonitor.yaml", "prometheusrule.yaml"}


if __name__ == "__main__":
    sys.stdout.write(prometheus_rule())


async def test_promtool_lints_the_exported_metrics() -> None:
    metrics = Metrics(process=False)
    sinks = SinkStatus()
    sinks.configure("cache", True)
    sinks.failed("cache", "the cache could not be written: No space left on device")
    metrics.follow_sinks(sinks.state)
    exported = generate_latest(metrics.registry)
    assert b'supervisor_sink_state{sink="cache",state="failing"} 1.0' in exported
    assert b'supervisor_sink_state{sink="snapshot_file",state="disabled"} 1.0' in exported
    result = subprocess.run([promtool(), "check", "metrics"], input=exported,
                            capture_output=True, timeout=60, check=False)
    assert result.returncode == 0 and not result.stdout.strip(), result
