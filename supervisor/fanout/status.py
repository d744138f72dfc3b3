"""Per-kind fan-out status, written by a watcher, read by the status report (docs/admin-api.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from supervisor.status_doc import FanoutReport, FanoutState

__all__ = ["FanoutStatus"]


@dataclass
class FanoutStatus:
    """One kind's ``state``, ``last_error_class``, parent ``objects`` and ``skewed`` names.

    ``state``: ``disabled``, ``preflight`` (also between two watches) or ``watching``
    (every watch of the kind open). ``skewed``: up to 20 parents that do not decode and
    are skipped, reported only when there are any.
    """

    state: FanoutState = "disabled"
    last_error_class: str | None = None
    objects: int = 0
    skewed: list[str] = field(default_factory=list)

    def report(self) -> FanoutReport:
        # ``skewed`` only when there are some: the documented shape otherwise.
        return FanoutReport(state=self.state, last_error_class=self.last_error_class,
                            objects=self.objects,
                            skewed=list(self.skewed) if self.skewed else msgspec.UNSET)
