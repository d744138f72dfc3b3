"""What the admin API reads. It reads state; it never drives the loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from supervisor.convergence.status import RevisionStatus
from supervisor.events import EventBus
from supervisor.fanout.status import FanoutStatus
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics

__all__ = ["AdminContext"]


@dataclass
class AdminContext:
    state: ActiveState
    revision: RevisionStatus
    events: EventBus
    metrics: Metrics
    # Children's report: {name: {"state", "restarts", "last_error"}}; the tree's report().
    children: Callable[[], dict[str, dict[str, Any]]]
    fanout: dict[str, FanoutStatus] = field(default_factory=dict)
    # The bearer token, already read from [admin].token_file; None = no auth.
    token: str | None = None
    # Why the process is not healthy (empty: healthy); the daemon's health().
    unhealthy: Callable[[], list[str]] = field(default=lambda: [])
    # [admin].allowed_hosts: names besides the listen address and loopback.
    allowed_hosts: tuple[str, ...] = ()

    def status(self) -> dict[str, Any]:
        """The /status document of CONTRACT.md section 6."""
        return {
            "revision": self.revision.report(),
            "children": self.children(),
            "fanout": {kind: st.report() for kind, st in self.fanout.items()},
        }
