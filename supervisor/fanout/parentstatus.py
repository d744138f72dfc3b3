"""The status a reconciler writes on a parent: ``observedGeneration``, ``Ready``, ``Available``.

Each condition's reasons and meaning: docs/kubernetes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supervisor.config import KubernetesConfig
from supervisor.fanout.drain import Drain
from supervisor.fanout.kind import Parent
from supervisor.fanout.live import LiveChildren, unavailable
from supervisor.kube.applying import Desired
from supervisor.kube.client import KubeClient
from supervisor.kube.errors import NotFound
from supervisor.kube.events import EventRecorder, EventType
from supervisor.kube.models import ParentStatus, Resource, kube_time

__all__ = ["ParentReporter", "StatusWant", "needs_write", "status_body"]


@dataclass(frozen=True)
class StatusWant:
    """The conditions we own for ``generation``: each one's (status, reason, message)."""

    generation: int
    ready: tuple[str, str, str]
    available: tuple[str, str, str] = ("False", "ChildrenUnavailable", "")

    def conditions(self) -> list[tuple[str, str, str, str]]:
        return [("Ready", *self.ready), ("Available", *self.available)]


def needs_write(current: ParentStatus, want: StatusWant) -> bool:
    """Does ``current`` differ from ``want`` in anything we own?"""
    return current.observed_generation != want.generation or any(
        (cond := current.condition(type_)) is None
        or (cond.status, cond.reason, cond.message) != (status, reason, message)
        for type_, status, reason, message in want.conditions())


def status_body(api_version: str, kind: str, name: str, namespace: str,
                current: ParentStatus, want: StatusWant) -> dict[str, Any]:
    """The apply configuration of the status subresource for ``want``."""
    conditions = [
        {"type": type_, "status": status, "reason": reason, "message": message,
         # Moved only when the condition's status does.
         "lastTransitionTime": cond.last_transition_time
         if (cond := current.condition(type_)) is not None and cond.status == status
         and cond.last_transition_time else kube_time(),
         "observedGeneration": want.generation}
        for type_, status, reason, message in want.conditions()]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "status": {"observedGeneration": want.generation, "conditions": conditions},
    }


@dataclass(eq=False)
class ParentReporter:
    """Writes a parent's status (only when it changes) and records Events on it.

    ``Ready`` is ``Applied``, ``Conflict``, ``Invalid``, ``ApplyFailed`` or
    ``RepairDeferred``. ``Available`` comes from the live children
    (:func:`~supervisor.fanout.live.unavailable`), the message naming the first child
    that is not. Events (``Applied`` when enabled, ``DriftRepaired``, ``ApplyFailed``,
    ``Invalid``, ``Conflict``) are best effort (:mod:`supervisor.kube.events`).
    """

    client: KubeClient
    resource: Resource
    config: KubernetesConfig
    live: LiveChildren
    drain: Drain

    def __post_init__(self) -> None:
        self.events = EventRecorder(self.client, self.config.field_manager, self.resource,
                                    self.config.control_namespace)
        # The parent's resourceVersion when we last wrote its status, and what we wrote
        # (None: the write found the parent deleted).
        self._written: dict[str, tuple[str, StatusWant | None]] = {}

    def forget(self, name: str | None = None) -> None:
        """Forget what was written (for one parent, or all: after a relist)."""
        if name is None:
            self._written.clear()
        else:
            self._written.pop(name, None)

    async def event(self, parent: Parent, type_: EventType, reason: str,
                    message: str) -> None:
        await self.events.emit(parent.metadata, type_, reason, message)

    async def write(self, parent: Parent, desired: list[Desired], status: str,
                    reason: str, message: str) -> None:
        """Write ``Ready``/``Available`` unless the parent already shows them.

    By server-side apply on the status subresource. Also skipped when we wrote the same
    for that resourceVersion and our event is on its way: an idle resync writes
    nothing. ``lastTransitionTime`` moves only when a condition's status does. A 404
    (the parent deleted, its DELETED event not here yet) is quiet. Nothing is written
    again to that name and resourceVersion: each would be another 404.
    """
        # Available from the live children, the message naming the first that is not.
        missing = [why for child in desired
                   if (why := unavailable(child, self.live.get(child.key))) is not None]
        available = (("False", "ChildrenUnavailable", missing[0][:1024]) if missing else
                     ("True", "ChildrenAvailable", f"{len(desired)} of {len(desired)} available"))
        want = StatusWant(parent.metadata.generation, (status, reason, message), available)
        meta = parent.metadata
        # Found deleted at this resourceVersion (its DELETED event follows), or written
        # already (our own MODIFIED event has not arrived yet).
        done = ((meta.resource_version, None), (meta.resource_version, want))
        if self._written.get(meta.name) in done or not needs_write(parent.status, want):
            return
        body = status_body(self.resource.api_version, self.resource.kind, meta.name,
                           self.config.control_namespace, parent.status, want)
        try:
            await self.drain.write(
                self.client.apply, self.resource, self.config.control_namespace, meta.name,
                body, field_manager=self.config.field_manager, force=True,
                subresource="status",
            )
        except NotFound:
            # The parent was deleted meanwhile; its DELETED event follows (or a relist).
            self._written[meta.name] = (meta.resource_version, None)
            return
        self._written[meta.name] = (meta.resource_version, want)
