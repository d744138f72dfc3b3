"""How leadership is reported: the ``/status`` part, the stream and STATUS= lines, metrics.

:class:`LeadershipStatus` is what the elector (:mod:`.leadership`) writes;
:func:`announcer` turns its changes into a ``status`` event and a ``STATUS=``
line, once per change; :class:`LeadershipMetrics` are ``supervisor_leader`` and
``supervisor_leader_transitions_total`` (defined here, not in
:mod:`supervisor.telemetry`: they exist only with election on).
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from supervisor.events import EventBus, StatusChanged
from supervisor.status_doc import LeadershipReport, Role

__all__ = ["LeadershipMetrics", "LeadershipStatus", "announcer", "default_identity"]


def default_identity() -> str:
    """``<hostname>_<pid>_<random>``: unique per process, readable in ``kubectl get lease``."""
    host = socket.gethostname().split(".")[0] or "replica"
    return f"{host[:80]}_{os.getpid()}_{random.getrandbits(32):08x}"


@dataclass
class LeadershipStatus:
    """What /status reports as ``leadership``."""

    role: Role = "disabled"
    holder: str | None = None
    lease: str | None = None
    identity: str | None = None

    def report(self) -> LeadershipReport:
        return LeadershipReport(role=self.role, holder=self.holder, lease=self.lease)


def announcer(events: EventBus, status_line: Callable[[str], None],
              ) -> Callable[[LeadershipStatus], None]:
    """An ``on_change`` that tells the stream (a ``status`` event) and systemd (``STATUS=``).

    Only real changes of the report are announced; the elector logs them itself.
    """
    last: list[LeadershipReport] = []

    def changed(status: LeadershipStatus) -> None:
        report = status.report()
        if last and last[0] == report:
            return
        last[:] = [report]
        events.emit(StatusChanged(leadership=report))
        if status.role == "leader":
            status_line(f"fan-out leader (lease {status.lease})")
        else:
            status_line(f"fan-out standby (leader: {status.holder or 'none'})")

    return changed


class LeadershipMetrics:
    """``supervisor_leader`` (1 while this replica leads) and the transitions counter."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.leader = Gauge("leader", "1 while this replica holds the fan-out Lease, else 0.",
                            namespace="supervisor", registry=registry)
        self.transitions = Counter(
            "leader_transitions", "Times this replica became or stopped being the fan-out "
            "leader.", ["to"], namespace="supervisor", registry=registry)
        for to in ("leader", "standby"):
            self.transitions.labels(to)
