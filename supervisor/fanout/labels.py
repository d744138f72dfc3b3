"""The labels every fanned-out object carries, one definition for all kinds (docs/kubernetes.md)."""

from __future__ import annotations

from typing import Final

__all__ = [
    "GROUP",
    "INSTALLATION_KEY",
    "LINEAGE_SERVICEDEFINITION",
    "LINEAGE_WORKFLOW",
    "MANAGED_BY_KEY",
    "MANAGED_BY_VALUE",
    "NAME_KEY",
    "foreign_selector",
    "labels",
    "lineage_selector",
]

GROUP: Final = "platform.trio-supervisor.dev"
NAME_KEY: Final = "app.kubernetes.io/name"
MANAGED_BY_KEY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "trio-supervisor"
LINEAGE_SERVICEDEFINITION: Final = f"{GROUP}/servicedefinition"
LINEAGE_WORKFLOW: Final = f"{GROUP}/workflow"
INSTALLATION_KEY: Final = f"{GROUP}/installation"


def labels(parent_name: str, lineage_key: str, installation: str) -> dict[str, str]:
    """The label set of an object fanned out from the parent ``parent_name``.

    The name label; managed-by ``trio-supervisor`` ("ours"); the lineage label
    (``<GROUP>/servicedefinition`` or ``/workflow``), naming the parent. Children live
    in another namespace than their parent, and Kubernetes ignores cross-namespace
    ownerReferences: the lineage label is how they are found again. The installation
    label (``[kubernetes].installation``) names the owner installation. Every child
    watch and every selector that can lead to a delete select on it, so two
    installations sharing an apps namespace never see each other's children.
    """
    return {
        NAME_KEY: parent_name,
        MANAGED_BY_KEY: MANAGED_BY_VALUE,
        INSTALLATION_KEY: installation,
        lineage_key: parent_name,
    }


def lineage_selector(lineage_key: str, installation: str,
                     parent_name: str | None = None) -> str:
    """A label selector for this installation's children: of one parent, or (None) of all."""
    lineage = lineage_key if parent_name is None else f"{lineage_key}={parent_name}"
    return f"{MANAGED_BY_KEY}={MANAGED_BY_VALUE},{INSTALLATION_KEY}={installation},{lineage}"


def foreign_selector(lineage_key: str, installation: str) -> str:
    """Children of this kind that another installation of trio-supervisor made (their
    installation label is not ours: :class:`~supervisor.fanout.live.ForeignChildren`)."""
    return (f"{MANAGED_BY_KEY}={MANAGED_BY_VALUE},{lineage_key},{INSTALLATION_KEY},"
            f"{INSTALLATION_KEY}!={installation}")
