"""What the fan-out engine knows of a kind: :class:`FanoutKind` and :class:`FanoutTuning`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec

from supervisor.kube.applying import Desired
from supervisor.kube.models import ObjectMeta, ParentStatus, Resource
from supervisor.kube.watching import WatchTuning

__all__ = ["FanoutKind", "FanoutTuning", "P", "Parent", "matters"]


class Parent(msgspec.Struct, kw_only=True):
    """What the engine reads of any parent: its metadata and the status we write."""

    metadata: ObjectMeta
    status: ParentStatus = msgspec.field(default_factory=ParentStatus)


P = TypeVar("P", bound=Parent)


@dataclass(frozen=True)
class FanoutKind(Generic[P]):
    """Everything kind-specific: the parent resource and type, and its children.

    ``ServiceDefinition`` and ``Workflow`` each define one.
    """

    kind: str
    resource: Resource
    parent_type: type[P]
    lineage_key: str
    child_resources: tuple[Resource, ...]
    # (parent, apps namespace, installation) -> children
    desired: Callable[[P, str, str], list[Desired]]

    def child_resource(self, plural: str) -> Resource:
        return next(res for res in self.child_resources if res.plural == plural)


@dataclass(frozen=True)
class FanoutTuning:
    """Timings and bounds; the defaults suit production, tests shrink them."""

    watch: WatchTuning = field(default_factory=WatchTuning)
    # Parents reconciled at once: each waits on its two writes' round trips, so a bulk is
    # paced by this (bench/bench_fanout_race.py, a 1,000-parent bulk on the real server:
    # 4 fell seconds behind the client creating them, 16 kept up, at no more CPU than 8).
    workers: int = 16
    resync_s: float | None = None  # None: [kubernetes].resync_s
    requeue_initial_s: float = 0.8
    requeue_max_s: float = 30.0
    drain_s: float = 2.0  # how long an in-flight write may finish after shutdown begins


def matters(old: Parent, new: Parent) -> bool:
    """Does an update change anything a reconcile reads (not a status-only write)?"""
    a, b = old.metadata, new.metadata
    return (a.generation, a.labels, a.annotations, a.deletion_timestamp) != (
        b.generation, b.labels, b.annotations, b.deletion_timestamp)
