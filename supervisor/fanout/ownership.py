"""Which objects in the apps namespace are ours to write, and which ours to delete.

The apps namespace is shared with its teams: an object of the name a child needs may
exist already, made by someone else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from supervisor.fanout.labels import INSTALLATION_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE
from supervisor.kube.errors import Conflict

__all__ = [
    "MANAGERS_FIELD",
    "OUR_MANAGERS",
    "conflict_managers",
    "created_by_update",
    "describe",
    "folded_managed_fields",
    "labels_of",
    "managers_of",
    "our_managers",
    "ours_to_write",
    "written_by_us",
]

#: Every field manager name this project has written with (git history: one so far).
OUR_MANAGERS: Final = frozenset({"trio-supervisor"})

#: Where the watched cache keeps who wrote an object (managedFields itself is not kept).
MANAGERS_FIELD: Final = "managers"

# kube-apiserver says `conflict with "m" using v1: .f` of one conflict, and of more a
# line `conflicts with "m" using v1:` a manager, its fields listed below it.
_CONFLICT_WITH = re.compile(r'conflicts? with "([^"]+)"')


def our_managers(configured: str) -> frozenset[str]:
    return OUR_MANAGERS | {configured}


def managers_of(obj: Mapping[str, Any]) -> dict[str, set[str]]:
    """manager -> its operations (``Apply``, ``Update``): managedFields, or the cache's summary."""
    metadata = obj.get("metadata") or {}
    summary = metadata.get(MANAGERS_FIELD)
    if isinstance(summary, Mapping):
        return {str(k): set(v) for k, v in summary.items()}
    found: dict[str, set[str]] = {}
    for entry in metadata.get("managedFields") or ():
        if isinstance(entry, Mapping) and entry.get("manager"):
            found.setdefault(str(entry["manager"]), set()).add(str(entry.get("operation", "")))
    return found


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def written_by_us(obj: Mapping[str, Any], managers: Iterable[str]) -> bool:
    """Has one of ``managers`` written ``obj`` (a managedFields entry of its own)?

    Only such an object is ever deleted, never on labels alone. Labels are anyone's to
    patch: a label-only match once deleted an unrelated Service with copied labels.
    """
    return not set(managers_of(obj)).isdisjoint(managers)


def ours_to_write(obj: Mapping[str, Any], *, lineage_key: str, parent: str,
                  installation: str, managers: Iterable[str]) -> bool:
    """May the parent ``parent`` write the existing ``obj``?

    Yes when it carries ``managed-by=trio-supervisor``, this installation's label and
    this parent's lineage label. Or managed-by, installation and a write of ours (a
    lineage label edited by hand on a child we made). Any other object of that name is
    **foreign**: left as it is, the parent reported ``Conflict`` (:func:`describe`).
    Adding those three labels hands an object over. An absent child is created with
    a POST, never an apply: an existing object is a 409 ``AlreadyExists``, never
    overwritten.
    """
    labels = labels_of(obj)
    return (labels.get(MANAGED_BY_KEY) == MANAGED_BY_VALUE
            and labels.get(INSTALLATION_KEY) == installation
            and (labels.get(lineage_key) == parent or written_by_us(obj, managers)))


def describe(obj: Mapping[str, Any], kind: str, namespace: str, lineage_key: str) -> str:
    """``Service apps/web (owner labels: managed-by=helm, no installation, no lineage)``."""
    labels = labels_of(obj)
    name = (obj.get("metadata") or {}).get("name", "")
    owners = ", ".join(
        f"{short}={labels[key]}" if labels.get(key) is not None else f"no {short}"
        for key, short in ((MANAGED_BY_KEY, "managed-by"), (INSTALLATION_KEY, "installation"),
                           (lineage_key, "lineage")))
    return f"{kind} {namespace}/{name} exists and is not ours (owner labels: {owners})"


def conflict_managers(exc: Conflict) -> set[str]:
    """The field managers a 409 apply conflict names (empty: not a field conflict).

    An apply to what is ours is forced only over managers whose claims are no
    declarations. Those are our own (:data:`OUR_MANAGERS` and the configured one), and
    those that changed a field by an update (``kubectl edit``/``scale``/``patch``:
    drift, repaired). A manager that *applied* declares its fields: the apply goes without
    ``force``, and a conflict naming it is reported ``Conflict``, never forced. Who
    applied is read from the watched managedFields, so a repair is one write. A
    conflict naming a manager not seen yet is checked on a fresh read before any force.
    """
    return set(_CONFLICT_WITH.findall(exc.message))


def created_by_update(obj: Mapping[str, Any], managers: Iterable[str]) -> bool:
    """Does a manager of ours hold fields of ``obj`` by an update (our create's POST)?"""
    ours = set(managers)
    return any(m in ours and "Update" in ops for m, ops in managers_of(obj).items())


def folded_managed_fields(obj: Mapping[str, Any], managers: Iterable[str], manager: str,
                          api_version: str, now: str) -> list[dict[str, Any]] | None:
    """``obj``'s managedFields with our managers' update entries folded into ``manager``'s
    apply entry (None: nothing to fold).

    kube-apiserver keys managers by name *and* operation. The POST that created a child
    left an Update entry co-owning every field it was created with. So an apply that
    stops setting one of them removed nothing. client-go's csaupgrade does the same
    fold.
    """
    ours = set(managers)
    metadata = obj.get("metadata") or {}
    kept: list[dict[str, Any]] = []
    folded: dict[str, Any] | None = None
    for entry in metadata.get("managedFields") or ():
        if not isinstance(entry, Mapping):
            continue
        if (entry.get("manager") in ours and entry.get("operation") == "Update"
                and not entry.get("subresource")):
            folded = _merge_fields(folded or {}, entry.get("fieldsV1") or {})
        else:
            kept.append(dict(entry))
    if folded is None:
        return None
    for entry in kept:
        if (entry.get("manager") == manager and entry.get("operation") == "Apply"
                and not entry.get("subresource")):
            entry["fieldsV1"] = _merge_fields(entry.get("fieldsV1") or {}, folded)
            return kept
    # An entry without its apiVersion is invalid, and kube-apiserver drops the lot then.
    kept.append({"manager": manager, "operation": "Apply", "apiVersion": api_version,
                 "time": now, "fieldsType": "FieldsV1", "fieldsV1": folded})
    return kept


def _merge_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The union of two FieldsV1 trees."""
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge_fields(out[key], value)
        else:
            out[key] = value
    return out
