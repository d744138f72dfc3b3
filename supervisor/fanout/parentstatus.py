"""The status a reconciler writes on a parent: ``observedGeneration``, ``Ready``, ``Available``.

Contract (CONTRACT.md section 8):

- ``Ready``: ``True`` (reason ``Applied``) when every child was applied for
  the observed generation; ``False`` with reason ``Conflict``, ``Invalid`` or
  ``ApplyFailed`` otherwise.
- ``Available``: ``True`` (reason ``ChildrenAvailable``) when every Deployment
  child reports its desired replicas available (and its controller has seen
  its current generation) and every other child exists; ``False`` (reason
  ``ChildrenUnavailable``, the message naming the first child that is not)
  otherwise.
- Written by server-side apply on the status subresource, only when it
  differs from what the parent already shows (or what we wrote for the same
  resourceVersion, while our own event is on its way): an idle resync writes
  nothing. ``lastTransitionTime`` moves only when a condition's status does.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

from supervisor.kube.models import ParentStatus

__all__ = ["StatusWant", "needs_write", "status_body"]


def _now_rfc3339() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class StatusWant:
    generation: int
    status: str
    reason: str
    message: str
    available: str = "False"
    available_reason: str = "ChildrenUnavailable"
    available_message: str = ""

    def conditions(self) -> list[tuple[str, str, str, str]]:
        return [
            ("Ready", self.status, self.reason, self.message),
            ("Available", self.available, self.available_reason, self.available_message),
        ]


def needs_write(current: ParentStatus, want: StatusWant) -> bool:
    """Does ``current`` differ from ``want`` in anything we own?"""
    if current.observed_generation != want.generation:
        return True
    for type_, status, reason, message in want.conditions():
        cond = current.condition(type_)
        if cond is None or (cond.status, cond.reason, cond.message) != (status, reason, message):
            return True
    return False


def status_body(api_version: str, kind: str, name: str, namespace: str,
                current: ParentStatus, want: StatusWant) -> dict[str, Any]:
    """The apply configuration of the status subresource for ``want``."""
    conditions = []
    for type_, status, reason, message in want.conditions():
        cond = current.condition(type_)
        transition = (
            cond.last_transition_time
            if cond is not None and cond.status == status and cond.last_transition_time
            else _now_rfc3339()
        )
        conditions.append({
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": transition,
            "observedGeneration": want.generation,
        })
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "status": {"observedGeneration": want.generation, "conditions": conditions},
    }
