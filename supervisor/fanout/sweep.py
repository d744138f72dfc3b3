"""The orphan sweep's safety catch.

An orphan is a child of this installation (managed-by, installation and
lineage labels) whose parent is not in the parent list. A parent list that is
wrong (a mistyped ``control_namespace`` whose list the RBAC happens to allow,
a restored-empty etcd, a CRD reinstalled empty) makes *every* child look
orphaned, and deleting them all is the one mistake a controller must not make
on its own.

Contract of :meth:`SweepGuard.allow`: a sweep that would delete more than
half of the children it sees *and* more than ``handful`` of them is refused
(False), and the parent list it saw is remembered. It stays refused until a
later sweep (the next resync) sees the very same parent list again: then the
list was not a glitch, and the sweep goes ahead. Any smaller sweep is allowed
and clears the memory.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["HANDFUL", "SweepGuard"]

HANDFUL = 5


class SweepGuard:
    """Refuses implausibly large sweeps until the same parent list is seen twice."""

    def __init__(self, handful: int = HANDFUL) -> None:
        self.handful = handful
        self._refused_for: frozenset[str] | None = None
        self.refusals = 0

    @property
    def holding(self) -> bool:
        """A sweep was refused and waits for the same parent list to come again."""
        return self._refused_for is not None

    def allow(self, orphans: int, seen: int, parents: Iterable[str]) -> bool:
        """May a sweep delete ``orphans`` of the ``seen`` children, given ``parents``?"""
        current = frozenset(parents)
        if orphans <= self.handful or orphans * 2 <= seen:
            self._refused_for = None
            return True
        if self._refused_for is not None and self._refused_for == current:
            self._refused_for = None
            return True
        self._refused_for = current
        self.refusals += 1
        return False
