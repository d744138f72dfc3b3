"""How a failed attempt is told: :class:`FailureLog`, its log lines and the STATUS= line."""

from __future__ import annotations

from collections.abc import Callable

from supervisor import reasons
from supervisor.convergence.outcome import Outcome
from supervisor.convergence.status import RevisionStatus
from supervisor.logs import get_logger
from supervisor.streak import Streak

__all__ = ["FailureLog"]

log = get_logger("convergence")


class FailureLog:
    """The log lines and status text of failed attempts, told as streaks.

    Streaks: :class:`~supervisor.streak.Streak`. An outage (``unavailable``, no revision)
    is a start, progress once a minute, and an end. A refusal, for every reason
    (``stale`` too), is logged at ``warning`` when it begins, at most once a minute
    while it repeats. Its end (``revision refusal recovered``, ``after_s``) comes at
    the next success. It repeats while its revision and reason stay; its detail may
    change (a stale statement ages every poll), and the line carries the latest.
    Every line carries ``retry_in_s``, the delay before the next attempt.
    """

    def __init__(self, status: RevisionStatus, on_status: Callable[[str], None]) -> None:
        self.status = status
        self.on_status = on_status
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

    def forget(self) -> None:
        """The next refusal is logged even when unchanged (SIGHUP: "look again")."""
        self._refusal = None

    def succeeded(self, active: int | None) -> bool:
        """An attempt succeeded: a refusal's or an outage's streak ends (logged once).

        True when an outage ended.
        """
        self.refused.recovered(active=active)
        self.refused_unasked.recovered(active=active)
        self._refusal = None
        return self.outage.recovered(active=active)

    def report(self, outcome: Outcome, retry_in_s: float) -> None:
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
