"""Workflow -> CronJob, in the apps namespace (the resource and its spec: docs/kubernetes.md)."""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.fanout.kind import FanoutKind, Parent
from supervisor.fanout.labels import GROUP, LINEAGE_WORKFLOW, labels
from supervisor.kube.applying import Desired, make_desired
from supervisor.kube.models import Resource

__all__ = ["CRONJOBS", "WORKFLOW", "WORKFLOWS", "Workflow", "WorkflowSpec", "desired_children"]

WORKFLOWS = Resource(GROUP, "v1", "workflows", "Workflow")
CRONJOBS = Resource("batch", "v1", "cronjobs", "CronJob")

CONTAINER = "main"


class WorkflowSpec(msgspec.Struct, rename="camel", kw_only=True):
    image: str
    schedule: str
    args: list[str] = []


class Workflow(Parent, kw_only=True):
    spec: WorkflowSpec


def desired_children(parent: Workflow, namespace: str, installation: str) -> list[Desired]:
    """The CronJob, named after the parent, our labels on it and on its pod template.

    So the Jobs' pods are attributable too. The schedule goes through as written: the
    API server validates it (a refusal shows as ``Ready=False``, reason ``Invalid``).
    """
    name = parent.metadata.name
    spec = parent.spec
    own = labels(name, LINEAGE_WORKFLOW, installation)
    container: dict[str, Any] = {"name": CONTAINER, "image": spec.image}
    if spec.args:
        container["args"] = list(spec.args)
    pod = {
        "metadata": {"labels": own},
        # A Job's pods may not use restartPolicy Always.
        "spec": {"restartPolicy": "OnFailure", "containers": [container]},
    }
    return [
        make_desired(
            CRONJOBS, namespace, name, labels=own,
            spec={
                "schedule": spec.schedule,
                "jobTemplate": {"metadata": {"labels": own}, "spec": {"template": pod}},
            },
        )
    ]


WORKFLOW: FanoutKind[Workflow] = FanoutKind(
    kind="Workflow",
    resource=WORKFLOWS,
    parent_type=Workflow,
    lineage_key=LINEAGE_WORKFLOW,
    child_resources=(CRONJOBS,),
    desired=desired_children,
)
