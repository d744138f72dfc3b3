"""How the loop tells what it does: :class:`Reporting`, its log lines, metrics and events."""

from __future__ import annotations

from collections.abc import Callable

from supervisor import reasons
from supervisor.bounds import cut
from supervisor.convergence.outcome import Outcome, OutcomeKind
from supervisor.convergence.status import RevisionStatus
from supervisor.errors import LabelledError
from supervisor.events import EventBus, Published, Rejected, StatusChanged
from supervisor.logs import get_logger
from supervisor.sinks.state import Serving
from supervisor.streak import Streak
from supervisor.telemetry import Metrics

__all__ = ["Reporting"]

log = get_logger("convergence")


def _ignore(_value: object) -> None:
    return None


class Reporting:
    """Where the loop tells what it does; the loop writes, others read.

    ``on_status`` takes the systemd STATUS= line. ``on_outage_change`` is told True
    when the control plane stops answering, False when it is back (the LISTEN child
    probes at once instead of waiting).

    Failed attempts are told as streaks (:class:`~supervisor.streak.Streak`). An
    outage (``unavailable``, no revision) is a start, progress once a minute, and an
    end. A refusal, for every reason (``stale`` too), is logged at ``warning`` when it
    begins, at most once a minute while it repeats. Its end (``revision refusal
    recovered``, ``after_s``) comes at the next success. It repeats while its revision
    and reason stay; its detail may change (a stale statement ages every poll), and
    the line carries the latest. Every line carries ``retry_in_s``, the delay before
    the next attempt.
    """

    def __init__(self, *, status: RevisionStatus, metrics: Metrics, events: EventBus,
                 on_status: Callable[[str], None] = _ignore,
                 on_outage_change: Callable[[bool], None] = _ignore) -> None:
        self.status = status
        self.metrics = metrics
        self.events = events
        self.on_status = on_status
        self.on_outage_change = on_outage_change
        # The revision gauges read the status: it is the one place they are written.
        metrics.follow_revision(status)
        self.outage = Streak(log, began="control plane unreachable",
                             ongoing="control plane still unreachable",
                             ended="control plane reachable again")
        self.refused = Streak(log, began="revision refused; previous snapshot keeps serving",
                              ongoing="revision refused; previous snapshot keeps serving",
                              ended="revision refusal recovered")
        self.refused_unasked = Streak(
            log, began="convergence attempt refused by the control plane; previous snapshot "
                       "keeps serving",
            ongoing="convergence attempt refused by the control plane; previous snapshot keeps "
                    "serving", ended="revision refusal recovered")
        # (revision, reason) of the refusal the streaks are about.
        self._refusal: tuple[object, ...] | None = None

    def reachable(self, up: bool) -> None:
        """A read answered (``up``) or not; a change is an event."""
        status = self.status
        was = status.control_plane_up
        if up:
            status.answered()
        else:
            status.unreachable()
        if was != up:
            self.events.emit(StatusChanged(control_plane_up=up, revision=status.report()))

    def published(self, serving: Serving, took_s: float) -> None:
        """``serving`` has just swapped in, ``took_s`` after its attempt began."""
        self.status.published(took_s)
        # As /status tells it: a follower names its upstream in place of control_plane.
        origin = self.status.state.origin or serving.source
        snapshot = serving.snapshot
        log.info("published", revision=snapshot.revision, generation=snapshot.generation,
                 source=origin, took_s=round(took_s, 6))
        self.events.emit(Published(revision=snapshot.revision, generation=snapshot.generation,
                                   source=origin, took_s=took_s))
        self.on_status(f"serving revision {snapshot.revision} "
                       f"(generation {snapshot.generation}, {origin})")

    def rejected(self, exc: LabelledError) -> Outcome:
        """Record ``exc``, an attempt's failure, and the outcome it makes."""
        # Cut where it enters: the status, the log, the events and the memo carry the cut text.
        reason, revision, detail = exc.reason, exc.revision, cut(exc.detail)
        status = self.status
        status.failed(revision, reason, detail, refusal=reason != reasons.UNAVAILABLE)
        self.metrics.revision_rejections.labels(reason).inc()
        outcome = Outcome(OutcomeKind.REJECTED, revision=revision, reason=reason, detail=detail)
        if revision is not None:
            self.events.emit(Rejected(revision=revision, reason=reason, detail=detail,
                                      active=status.active))
            status.remember_refusal(exc, outcome)
        if reason == reasons.UNAVAILABLE and revision is None and not self.outage.ongoing:
            self.on_outage_change(True)
        return outcome

    def forget(self) -> None:
        """The next refusal is logged even when unchanged (SIGHUP: "look again")."""
        self._refusal = None

    def _answered(self, active: int | None) -> None:
        """The control plane answered an attempt: an outage's streak ends (logged once)."""
        if self.outage.recovered(active=active):
            self.on_outage_change(False)

    def succeeded(self, active: int | None) -> None:
        """An attempt succeeded: a refusal's or an outage's streak ends (logged once)."""
        self.refused.recovered(active=active)
        self.refused_unasked.recovered(active=active)
        self._refusal = None
        self._answered(active)

    def failed(self, outcome: Outcome, retry_in_s: float) -> None:
        """Log a failed attempt (rate-limited when repeated) and update STATUS=."""
        assert outcome.reason is not None
        status = self.status
        fields = {"reason": outcome.reason, "revision": outcome.revision,
                  "detail": outcome.detail, "active": status.active,
                  "consecutive_failures": status.consecutive_failures,
                  "retry_in_s": round(retry_in_s, 3)}
        if outcome.reason == reasons.UNAVAILABLE and outcome.revision is None:
            # Only "could not be asked" is an outage; contention (conflict) is
            # the control plane answering, logged as a refusal like a denial.
            self.outage.failed(**fields)
        else:
            self._answered(status.active)  # a refusal is the control plane answering
            refusal = (outcome.revision, outcome.reason)
            if refusal != self._refusal:
                self.refused.reset()
                self.refused_unasked.reset()
            self._refusal = refusal
            if outcome.revision is not None:
                self.refused.failed(repeated=outcome.repeated, **fields)
            else:
                self.refused_unasked.failed(**fields)
        active = status.active
        self.on_status(
            f"serving revision {active}; last attempt failed: {outcome.reason}"
            if active is not None else f"not serving; last attempt failed: {outcome.reason}"
        )
