"""Per-kind fan-out status, written by a watcher and read by the status report.

``state`` is ``disabled``, ``preflight`` (also between two watches) or
``watching`` (every watch of the kind open) (docs/admin-api.md);
``last_error_class`` is None, ``schema_skew`` or ``namespace_or_rbac_unready``;
``objects`` is the number of parent objects currently known; ``skewed`` names
(up to 20) the parents that do not decode and are skipped, reported
only when there are any.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from supervisor.status_doc import FanoutReport, FanoutState

__all__ = ["FanoutStatus"]


@dataclass
class FanoutStatus:
    state: FanoutState = "disabled"
    last_error_class: str | None = None
    objects: int = 0
    skewed: list[str] = field(default_factory=list)

    def report(self) -> FanoutReport:
        # ``skewed`` only when there are some: the documented shape otherwise.
        return FanoutReport(state=self.state, last_error_class=self.last_error_class,
                            objects=self.objects,
                            skewed=list(self.skewed) if self.skewed else msgspec.UNSET)
