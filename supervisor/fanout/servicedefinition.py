"""ServiceDefinition -> Deployment (+ Service when ``port`` is set), in the apps namespace.

The resource and its spec: docs/kubernetes.md.
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.fanout.kind import FanoutKind, Parent
from supervisor.fanout.labels import GROUP, LINEAGE_SERVICEDEFINITION, NAME_KEY, labels
from supervisor.kube.applying import Desired, make_desired
from supervisor.kube.models import Resource

__all__ = [
    "DEPLOYMENTS",
    "SERVICEDEFINITIONS",
    "SERVICES",
    "SERVICE_DEFINITION",
    "ServiceDefinition",
    "ServiceDefinitionSpec",
    "desired_children",
]

SERVICEDEFINITIONS = Resource(GROUP, "v1", "servicedefinitions", "ServiceDefinition")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
SERVICES = Resource("", "v1", "services", "Service")

CONTAINER = "main"


class ServiceDefinitionSpec(msgspec.Struct, rename="camel", kw_only=True):
    image: str
    replicas: int = 1
    port: int | None = None
    env: dict[str, str] = {}


class ServiceDefinition(Parent, kw_only=True):
    """The fields read here only: a CRD whose schema disagrees fails its decode (schema skew).

    ``replicas`` a string or ``image`` missing, say; the preflight and the watcher
    report it.
    """

    spec: ServiceDefinitionSpec


def desired_children(
    parent: ServiceDefinition, namespace: str, installation: str
) -> list[Desired]:
    """The Deployment, and the Service with ``port``: named after the parent, our labels.

    The Deployment's selector uses the name and lineage labels only. They never change
    for a given parent, and a Deployment's selector is immutable.
    """
    name = parent.metadata.name
    spec = parent.spec
    own = labels(name, LINEAGE_SERVICEDEFINITION, installation)
    selector = {NAME_KEY: name, LINEAGE_SERVICEDEFINITION: name}
    container: dict[str, Any] = {"name": CONTAINER, "image": spec.image}
    if spec.env:
        # Sorted: the same map must always produce the same body (and digest).
        container["env"] = [{"name": k, "value": v} for k, v in sorted(spec.env.items())]
    if spec.port is not None:
        container["ports"] = [{"name": CONTAINER, "containerPort": spec.port, "protocol": "TCP"}]
    children = [
        make_desired(
            DEPLOYMENTS, namespace, name, labels=own,
            spec={
                "replicas": spec.replicas,
                "selector": {"matchLabels": selector},
                "template": {"metadata": {"labels": own}, "spec": {"containers": [container]}},
            },
        )
    ]
    if spec.port is not None:
        children.append(
            make_desired(
                SERVICES, namespace, name, labels=own,
                spec={
                    "selector": selector,
                    "ports": [{"name": CONTAINER, "port": spec.port, "targetPort": spec.port,
                               "protocol": "TCP"}],
                },
            )
        )
    return children


SERVICE_DEFINITION: FanoutKind[ServiceDefinition] = FanoutKind(
    kind="ServiceDefinition",
    resource=SERVICEDEFINITIONS,
    parent_type=ServiceDefinition,
    lineage_key=LINEAGE_SERVICEDEFINITION,
    child_resources=(DEPLOYMENTS, SERVICES),
    desired=desired_children,
)
