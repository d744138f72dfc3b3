"""The fan-out's labels (docs/kubernetes.md) and the desired children built from a parent."""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.fanout.labels import (
    LINEAGE_SERVICEDEFINITION,
    LINEAGE_WORKFLOW,
    labels,
    lineage_selector,
)
from supervisor.fanout.servicedefinition import ServiceDefinition
from supervisor.fanout.servicedefinition import desired_children as sd_children
from supervisor.fanout.workflow import Workflow
from supervisor.fanout.workflow import desired_children as wf_children
from supervisor.kube.applying import DIGEST_ANNOTATION


def test_labels_are_name_managed_by_and_lineage() -> None:
    assert labels("web", LINEAGE_SERVICEDEFINITION, "prod") == {
        "app.kubernetes.io/name": "web",
        "app.kubernetes.io/managed-by": "trio-supervisor",
        "platform.trio-supervisor.dev/installation": "prod",
        "platform.trio-supervisor.dev/servicedefinition": "web",
    }
    assert labels("nightly", LINEAGE_WORKFLOW, "prod")[
        "platform.trio-supervisor.dev/workflow"] == "nightly"


def test_lineage_selector() -> None:
    # Every selector carries the installation: another installation's children never match.
    assert lineage_selector(LINEAGE_WORKFLOW, "prod") == (
        "app.kubernetes.io/managed-by=trio-supervisor,"
        "platform.trio-supervisor.dev/installation=prod,platform.trio-supervisor.dev/workflow")
    assert lineage_selector(LINEAGE_WORKFLOW, "prod", "x").endswith("/workflow=x")


def _sd(**spec: Any) -> ServiceDefinition:
    return msgspec.convert({"metadata": {"name": "web", "generation": 3},
                            "spec": {"image": "nginx", **spec}}, ServiceDefinition)


def test_servicedefinition_without_port_is_one_deployment() -> None:
    (deployment,) = sd_children(_sd(), "apps", "prod")
    body: Any = deployment.body
    assert (body["apiVersion"], body["kind"]) == ("apps/v1", "Deployment")
    assert body["metadata"]["namespace"] == "apps" and deployment.name == "web"
    assert body["metadata"]["labels"] == labels("web", LINEAGE_SERVICEDEFINITION, "prod")
    assert body["metadata"]["annotations"] == {DIGEST_ANNOTATION: deployment.digest}
    assert body["spec"]["replicas"] == 1
    selector = body["spec"]["selector"]["matchLabels"]
    template_labels = body["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= template_labels.items()
    assert "app.kubernetes.io/managed-by" not in selector  # the selector never changes
    assert "ports" not in body["spec"]["template"]["spec"]["containers"][0]


def test_servicedefinition_with_port_adds_a_service_and_sorted_env() -> None:
    deployment, service = sd_children(_sd(port=8080, replicas=3, env={"Z": "1", "A": "2"}),
                                      "apps", "prod")
    container = deployment.body["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": "A", "value": "2"}, {"name": "Z", "value": "1"}]
    assert container["ports"][0]["containerPort"] == 8080
    assert deployment.body["spec"]["replicas"] == 3
    assert (service.body["kind"], service.name) == ("Service", "web")
    assert service.body["spec"]["ports"][0]["port"] == 8080
    assert service.body["spec"]["selector"] == deployment.body["spec"]["selector"]["matchLabels"]


def test_digest_is_stable_and_follows_the_spec() -> None:
    first = sd_children(_sd(env={"A": "1", "B": "2"}), "apps", "prod")[0]
    again = sd_children(_sd(env={"B": "2", "A": "1"}), "apps", "prod")[0]
    other = sd_children(_sd(env={"A": "1", "B": "3"}), "apps", "prod")[0]
    assert first.digest == again.digest
    assert first.digest != other.digest


def test_workflow_is_one_cronjob() -> None:
    workflow = msgspec.convert({"metadata": {"name": "nightly"},
                                "spec": {"image": "busybox", "schedule": "0 3 * * *",
                                         "args": ["run", "--all"]}}, Workflow)
    (cron,) = wf_children(workflow, "apps", "prod")
    body: Any = cron.body
    assert (body["apiVersion"], body["kind"], cron.name) == ("batch/v1", "CronJob", "nightly")
    assert body["spec"]["schedule"] == "0 3 * * *"
    pod = body["spec"]["jobTemplate"]["spec"]["template"]
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    assert pod["spec"]["containers"][0]["args"] == ["run", "--all"]
    assert pod["metadata"]["labels"] == labels("nightly", LINEAGE_WORKFLOW, "prod")
