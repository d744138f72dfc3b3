"""What the admin API reads. It reads state; it drives the loop only through ``converge``,
which queues a request on the change signal (the loop never waits on the API)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from supervisor import __version__
from supervisor.admin.signed import SignedRevisionFile
from supervisor.convergence.side_sinks import SinkStatus
from supervisor.convergence.signal import ConvergeAnswer
from supervisor.convergence.status import RevisionStatus
from supervisor.events import EventBus, utc_now_iso
from supervisor.fanout.status import FanoutStatus
from supervisor.sinks.state import ActiveState
from supervisor.status_doc import ChildReport, LeadershipReport, StatusDocument
from supervisor.telemetry import Metrics
from supervisor.threads import outliving

__all__ = ["AdminContext"]


@dataclass
class AdminContext:
    state: ActiveState
    revision: RevisionStatus
    events: EventBus
    metrics: Metrics
    # Children's report by name; the tree's report().
    children: Callable[[], dict[str, ChildReport]]
    fanout: dict[str, FanoutStatus] = field(default_factory=dict)
    # The bearer token, already read from [admin].token_file; None = no auth.
    token: str | None = None
    # [admin].read_token_file's token: the GET routes and the stream only.
    read_token: str | None = None
    # Told after set_tokens: the stream closes the clients the new tokens refuse.
    tokens_changed: list[Callable[[], None]] = field(default_factory=list)
    # Why the process is not healthy (empty: healthy); the daemon's health().
    unhealthy: Callable[[], list[str]] = field(default=lambda: [])
    # [admin].allowed_hosts: names besides the listen address and loopback.
    allowed_hosts: tuple[str, ...] = ()
    # [admin].allowed_origins: origins besides the listener's own.
    allowed_origins: tuple[str, ...] = ()
    # POST /v1/converge: request an attempt and wait (with the deadline given)
    # for its answer; None when the deadline passed. None: the route answers 503.
    converge: Callable[[float], Awaitable[ConvergeAnswer | None]] | None = None
    # What GET /v1/revision serves (the signed cache file); None: 503 there.
    signed: SignedRevisionFile | None = None
    # The fan-out leadership report; None: no election (role disabled).
    leadership: Callable[[], LeadershipReport] | None = None
    # The side sinks' state (cache, snapshot file); both "disabled" unless given.
    sinks: SinkStatus = field(default_factory=SinkStatus)
    # When this process started serving its admin API (UTC, ISO 8601): /status `started_at`.
    started_at: str = field(default_factory=utc_now_iso)

    def set_tokens(self, token: str | None, read_token: str | None) -> None:
        """Replace both tokens (a reload); the old ones are refused from now on, streams too."""
        self.token, self.read_token = token, read_token
        for told in self.tokens_changed:
            told()

    def status(self) -> StatusDocument:
        """The /status document (:class:`~supervisor.status_doc.StatusDocument`)."""
        return StatusDocument(
            revision=self.revision.report(), children=self.children(),
            fanout={kind: st.report() for kind, st in self.fanout.items()},
            leadership=self.leadership() if self.leadership is not None
            else LeadershipReport(role="disabled", holder=None, lease=None),
            sinks=self.sinks.report(), version=__version__, started_at=self.started_at,
            threads_past_deadline=outliving())
