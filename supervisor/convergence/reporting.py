"""How a failed attempt is told: log lines an operator can read, and the STATUS= line.

- An outage (the control plane could not be asked: ``unavailable``, no revision
  involved) is a start, progress once a minute and an end (:class:`~supervisor.outage.OutageLog`).
- A refusal repeated unchanged is logged at most once a minute, except while
  the cache serves instead of a refused desired revision: then at every poll,
  because the replica is serving something other than what is desired.
- Every line carries ``retry_in_s``, the delay before the next attempt.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from supervisor import reasons
from supervisor.convergence.outcome import Outcome
from supervisor.convergence.status import RevisionStatus
from supervisor.logs import get_logger
from supervisor.outage import PROGRESS_EVERY_S, OutageLog

__all__ = ["FailureLog"]

log = get_logger("convergence")


class FailureLog:
    """The log lines and status text of failed attempts, rate-limited as above."""

    def __init__(self, status: RevisionStatus, on_status: Callable[[str], None]) -> None:
        self.status = status
        self.on_status = on_status
        self.outage = OutageLog(log, "control plane")
        # (revision, reason, detail) last logged as refused, and when.
        self._last_refusal_line: tuple[tuple[object, ...], float] | None = None

    def forget(self) -> None:
        """The next refusal is logged even when unchanged (SIGHUP: "look again")."""
        self._last_refusal_line = None

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
            now = trio.current_time()
            line = (outcome.revision, outcome.reason, outcome.detail)
            last = self._last_refusal_line
            every_poll = status.source == "last_known_good"
            if (every_poll or last is None or last[0] != line
                    or now - last[1] >= PROGRESS_EVERY_S):
                self._last_refusal_line = (line, now)
                if outcome.revision is not None:
                    log.error("revision refused; previous snapshot keeps serving",
                              repeated=outcome.repeated, **fields)
                else:
                    log.error("convergence attempt refused by the control plane; previous "
                              "snapshot keeps serving", **fields)
        active = status.active
        self.on_status(
            f"serving revision {active}; last attempt failed: {outcome.reason}"
            if active is not None else f"not serving; last attempt failed: {outcome.reason}"
        )
