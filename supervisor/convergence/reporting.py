"""How a failed attempt is told: log lines an operator can read, and the STATUS= line.

Failures are told as streaks (:class:`~supervisor.streak.Streak`):

- An outage (the control plane could not be asked: ``unavailable``, no revision
  involved) is a start, progress once a minute and an end.
- A refusal repeated unchanged is logged at most once a minute (a different
  one begins a new streak), except while the cache serves instead of a refused
  desired revision: then at every poll, because the replica is serving
  something other than what is desired. A refusal has no end line (the
  publish that follows says itself).
- Every line carries ``retry_in_s``, the delay before the next attempt.
"""

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
    """The log lines and status text of failed attempts, rate-limited as above."""

    def __init__(self, status: RevisionStatus, on_status: Callable[[str], None]) -> None:
        self.status = status
        self.on_status = on_status
        self.outage = Streak(log, began="control plane unreachable",
                             ongoing="control plane still unreachable",
                             ended="control plane reachable again")
        self.refused = Streak(log, level="error",
                              began="revision refused; previous snapshot keeps serving",
                              ongoing="revision refused; previous snapshot keeps serving")
        self.refused_unasked = Streak(
            log, level="error",
            began="convergence attempt refused by the control plane; previous snapshot keeps "
                  "serving",
            ongoing="convergence attempt refused by the control plane; previous snapshot keeps "
                    "serving")
        # (revision, reason, detail) of the refusal the streaks are about.
        self._refusal: tuple[object, ...] | None = None

    def forget(self) -> None:
        """The next refusal is logged even when unchanged (SIGHUP: "look again")."""
        self._refusal = None

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
            refusal = (outcome.revision, outcome.reason, outcome.detail)
            if refusal != self._refusal or status.source == "last_known_good":
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
