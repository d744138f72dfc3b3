"""Typed shapes of the Kubernetes bodies we read, as msgspec Structs.

Each declares only the fields we read; others are ignored, so a newer server is no skew.
A missing or mistyped field is a ValidationError naming ``$.path``: the client's SchemaSkew.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

import msgspec

__all__ = [
    "Condition",
    "ListMeta",
    "ObjectList",
    "ObjectMeta",
    "ParentStatus",
    "PartialMeta",
    "PartialObject",
    "RawWatchEvent",
    "Resource",
    "Status",
    "StatusCause",
    "StatusDetails",
    "kube_time",
]

T = TypeVar("T")


def kube_time() -> str:
    """Now as a Kubernetes ``Time`` (RFC 3339 UTC, whole seconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Resource:
    """One namespaced API resource: ``group`` is ``""`` for the core group.

    Plain data, not a Struct; builds the resource's URL paths.
    """

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def group_version_path(self) -> str:
        """Discovery of this resource's group/version (``/apis/batch/v1``)."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection_path(self, namespace: str) -> str:
        return f"{self.group_version_path()}/namespaces/{namespace}/{self.plural}"

    def object_path(self, namespace: str, name: str, subresource: str | None = None) -> str:
        path = f"{self.collection_path(namespace)}/{name}"
        return f"{path}/{subresource}" if subresource else path

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


class _Wire(msgspec.Struct, rename="camel", kw_only=True):
    """Base: camelCase on the wire (``rename="camel"``), unknown fields ignored."""


class ObjectMeta(_Wire):
    """The metadata of an object we decode fully (a parent)."""

    name: str
    namespace: str | None = None
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    deletion_timestamp: str | None = None


class PartialMeta(_Wire):
    """Metadata read leniently: of a child, a bookmark, or a skewed object."""

    name: str = ""
    resource_version: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class PartialObject(_Wire):
    """Any object, of which only the metadata is read."""

    metadata: PartialMeta = msgspec.field(default_factory=PartialMeta)


class ListMeta(_Wire):
    resource_version: str = ""
    # ``continue`` is a Python keyword; the wire name is set explicitly.
    continue_: str | None = msgspec.field(default=None, name="continue")


class ObjectList(_Wire, Generic[T]):
    """A list response; ``items`` decode into ``T`` (``msgspec.Raw`` to defer)."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[T] = []


class StatusCause(_Wire):
    """One of a ``Status``'s ``details.causes`` (``reason`` is the cause type on the wire)."""

    reason: str = ""
    message: str = ""


class StatusDetails(_Wire):
    """A ``Status``'s ``details``; only the causes are read."""

    causes: list[StatusCause] = []


class Status(_Wire):
    """The ``Status`` body of an error response or a watch ``ERROR`` event."""

    code: int = 0
    reason: str = ""
    message: str = ""
    details: StatusDetails | None = None

    @property
    def causes(self) -> list[StatusCause]:
        return self.details.causes if self.details is not None else []


class RawWatchEvent(_Wire):
    """One line of a watch stream; ``object`` is decoded separately, one at a time."""

    type: str
    object: msgspec.Raw


class Condition(_Wire):
    """A ``metav1.Condition`` as found in a parent's status."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int | None = None


class ParentStatus(_Wire):
    """The status our reconcilers write on a parent (observedGeneration, Ready)."""

    observed_generation: int | None = None
    conditions: list[Condition] = []

    def condition(self, type_: str) -> Condition | None:
        return next((cond for cond in self.conditions if cond.type == type_), None)
