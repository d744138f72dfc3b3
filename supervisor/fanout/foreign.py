"""Children of *other* installations that share our apps namespace: never ours to write.

Two installations may share an apps namespace (README, "The installation
label"). Children are named after their parent, so when both have a parent of
the same name, both want the same child. Server-side apply with ``force``
would take the other installation's child over (relabelling it as ours), the
other installation would repair it back, and so on. Our own child watch
cannot see the other's child (it selects on our installation label), so it
looks absent, and a reconcile would "create" it.

:class:`ForeignChildren` is the informer handler of one more watch per child
resource, selected by :func:`foreign_selector` (managed by trio-supervisor,
this kind's lineage label, an installation label that is not ours). Contract:

- :meth:`ForeignChildren.owner` names the installation holding a child of
  that key (None: no other installation has it). The reconcile leaves such a
  child alone and reports the parent ``Ready=False`` (reason ``Conflict``).
- Every change or delete of such a child enqueues our parent of the same name
  (the lineage label), so ours is created as soon as the other one is gone.
- Children without any installation label (made by a build before the label)
  are not foreign: they are adopted and relabelled by their parent's reconcile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from supervisor.fanout.labels import INSTALLATION_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE
from supervisor.fanout.live import ChildIndex, Obj, child_name
from supervisor.fanout.ownership import labels_of
from supervisor.kube.applying import ChildKey
from supervisor.kube.models import Resource

__all__ = ["ForeignChildren", "foreign_selector"]

def foreign_selector(lineage_key: str, installation: str) -> str:
    """Children of this kind that another installation of trio-supervisor made."""
    return (f"{MANAGED_BY_KEY}={MANAGED_BY_VALUE},{lineage_key},{INSTALLATION_KEY},"
            f"{INSTALLATION_KEY}!={installation}")


class ForeignChildren(ChildIndex):
    """Which of this kind's child names another installation holds (see the module doc)."""

    def __init__(self, resources: Iterable[Resource], lineage_key: str,
                 enqueue: Callable[[str], None]) -> None:
        super().__init__(resources, lineage_key, enqueue)
        # key -> (installation, parent named by the lineage label)
        self._held: dict[ChildKey, tuple[str, str]] = {}

    def clear(self) -> None:
        super().clear()
        self._held.clear()

    def owner(self, key: ChildKey) -> str | None:
        """The other installation holding ``key``, if any."""
        held = self._held.get(key)
        return held[0] if held is not None else None

    def replace(self, resource: Resource, objects: Iterable[Obj]) -> None:
        touched = {parent for key, (_, parent) in self._held.items()
                   if key.plural == resource.plural}
        self._held = {key: value for key, value in self._held.items()
                      if key.plural != resource.plural}
        for obj in objects:
            touched.add(self._store(resource, obj))
        self._mark_listed(resource)
        for parent in sorted(touched):
            if parent:
                self._enqueue(parent)

    def observe(self, resource: Resource, obj: Obj) -> None:
        parent = self._store(resource, obj)
        if parent:
            self._enqueue(parent)

    def forget(self, resource: Resource, name: str) -> None:
        held = self._held.pop(ChildKey(resource.plural, name), None)
        if held is not None and held[1]:
            self._enqueue(held[1])

    def _store(self, resource: Resource, obj: Obj) -> str:
        parent = self.parent_of(obj)
        self._held[ChildKey(resource.plural, child_name(obj))] = (
            str(labels_of(obj).get(INSTALLATION_KEY, "")), parent)
        return parent
