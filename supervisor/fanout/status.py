"""Per-kind fan-out status, written by a watcher and read by the status report.

``state`` is ``disabled``, ``preflight`` or ``watching`` (CONTRACT.md section 6);
``last_error_class`` is None, ``schema_skew`` or ``namespace_or_rbac_unready``;
``objects`` is the number of parent objects currently known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["FanoutStatus"]

FanoutState = Literal["disabled", "preflight", "watching"]


@dataclass
class FanoutStatus:
    state: FanoutState = "disabled"
    last_error_class: str | None = None
    objects: int = 0

    def report(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "last_error_class": self.last_error_class,
            "objects": self.objects,
        }
