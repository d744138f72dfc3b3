"""The orphan sweep (:class:`Sweeper`) and its safety catch (:class:`SweepGuard`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.config import KubernetesConfig
from supervisor.fanout.drain import Drain
from supervisor.fanout.kind import FanoutKind
from supervisor.fanout.live import LiveChildren, terminating
from supervisor.fanout.ownership import our_managers, written_by_us
from supervisor.kube.applying import ChildKey
from supervisor.kube.client import KubeClient
from supervisor.kube.errors import KubeError
from supervisor.logs import get_logger
from supervisor.telemetry import Metrics

__all__ = ["HANDFUL", "SweepGuard", "Sweeper"]

log = get_logger("fanout")

HANDFUL = 5


class SweepGuard:
    """Refuses implausibly large sweeps until the same parent list is seen twice.

    A wrong parent list (a mistyped ``control_namespace`` the RBAC allows, a
    restored-empty etcd, a CRD reinstalled empty) makes *every* child look orphaned.
    Deleting them all is the one mistake a controller must not make on its own.
    """

    def __init__(self, handful: int = HANDFUL) -> None:
        self.handful = handful
        self._refused_for: frozenset[str] | None = None
        self.refusals = 0

    @property
    def holding(self) -> bool:
        """A sweep was refused and waits for the same parent list to come again."""
        return self._refused_for is not None

    def allow(self, orphans: int, seen: int, parents: Iterable[str]) -> bool:
        """May a sweep delete ``orphans`` of the ``seen`` children, given ``parents``?

        Not when over half of them *and* over ``handful``: refused, and the parent list
        remembered. It stays refused until a later sweep (the next resync) sees the very
        same list: then it was no glitch, and the sweep goes ahead. A smaller sweep is
        allowed and clears the memory.
        """
        current = frozenset(parents)
        if orphans <= self.handful or orphans * 2 <= seen or self._refused_for == current:
            self._refused_for = None
            return True
        self._refused_for = current
        self.refusals += 1
        return False


@dataclass(eq=False)
class Sweeper:
    """Deletes this installation's orphans, behind a :class:`SweepGuard`.

    An orphan is a child of this installation whose parent is not in the parent list,
    found in the watched children (:class:`~supervisor.fanout.live.LiveChildren`). Not
    one being deleted already (a finalizer holds it). Not one ``claimant(key)`` names,
    an existing parent that wants it (a hand-edited lineage label). Not one no manager
    of ours wrote (:func:`~supervisor.fanout.ownership.written_by_us`). A failed delete
    is logged and left to the next resync.
    """

    client: KubeClient
    kind: FanoutKind[Any]
    config: KubernetesConfig
    live: LiveChildren
    drain: Drain
    metrics: Metrics
    claimant: Callable[[ChildKey], str | None]
    guard: SweepGuard = field(default_factory=SweepGuard)

    def __post_init__(self) -> None:
        self._managers = our_managers(self.config.field_manager)
        self._unwritten_said: set[ChildKey] = set()
        self._log = log.bind(kind=self.kind.kind)

    async def sweep(self, known: set[str]) -> None:
        """Delete every watched child whose parent is not in ``known`` (unless refused)."""
        orphans = [(key, self.live.parent_of(obj)) for key, obj in self.live.items()
                   if self.live.parent_of(obj) not in known and not terminating(obj)
                   and self.claimant(key) is None and self._written_by_us(key, obj)]
        seen = len(self.live)
        if orphans and not self.guard.allow(len(orphans), seen, known):
            self.metrics.fanout_sweeps_refused.labels(self.kind.kind).inc()
            self._log.error(
                "orphan sweep refused", detail=
                f"it would delete {len(orphans)} of the {seen}"
                " children of this installation (more than half); the parent list looks"
                " wrong (control_namespace, installation, a restored or emptied API"
                " server?). If it is right, the next resync that sees the same parent"
                " list sweeps them",
                count=len(orphans), seen=seen, parents=len(known),
                installation=self.config.installation_label,
            )
            return
        for key, parent in orphans:
            await self._delete(key, parent)

    def _written_by_us(self, key: ChildKey, obj: Mapping[str, Any]) -> bool:
        """Labels are anyone's to patch: only what we wrote is ever swept (logged once)."""
        if written_by_us(obj, self._managers):
            return True
        if key not in self._unwritten_said:
            self._unwritten_said.add(key)
            self._log.warning("an object carries our labels but was never written by us;"
                              " not swept", resource=key.plural, name=key.name,
                              parent=self.live.parent_of(obj))
        return False

    async def sweep_late(self, known: set[str]) -> None:
        """Sweep again for a child written after the last sweep (unless a refusal holds).

        A relist that drops a parent (its DELETED event lost with the watch history)
        sweeps at once. But a child whose apply was still on the wire lands after that
        sweep, and its watch event, no newer than the apply's answer, queues nothing. A
        refused sweep waits for the next resync to confirm the parent list: this sweep
        never does.
        """
        if not self.guard.holding:
            await self.sweep(known)

    async def _delete(self, key: ChildKey, parent: str) -> None:
        resource = self.kind.child_resource(key.plural)
        try:
            await self.drain.write(self.client.delete, resource, self.config.apps_namespace,
                                    key.name)
        except KubeError as exc:
            self.metrics.fanout_applies.labels(self.kind.kind, "error").inc()
            self._log.warning("orphan sweep failed; the next resync retries",
                              resource=str(resource), name=key.name, error=str(exc))
            return
        self.live.discard(key)
        self.metrics.fanout_applies.labels(self.kind.kind, "deleted").inc()
        self._log.info("orphan swept", resource=str(resource), name=key.name, parent=parent)
