"""A refusal repeated unchanged: one warning, then at most one a minute, then its end (virtual time).

For every reason, ``stale`` included, whose detail (the statement's age) changes
at every poll.
"""

from __future__ import annotations

import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.convergence.outcome import Outcome, OutcomeKind
from supervisor.convergence.reporting import Reporting
from supervisor.convergence.status import RevisionStatus
from supervisor.events import EventBus
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics

BEGAN_UNASKED = ("convergence attempt refused by the control plane; previous snapshot keeps "
                 "serving")
BEGAN = "revision refused; previous snapshot keeps serving"
ENDED = "revision refusal recovered"


def _stale(age_s: int) -> Outcome:
    return Outcome(OutcomeKind.REJECTED, reason=reasons.STALE,
                   detail=f"the root's statement expired {age_s} s ago")


async def test_a_stale_refusal_is_one_warning_a_minute_and_its_end_is_logged(
        autojump_clock: trio.testing.MockClock) -> None:
    outages: list[bool] = []
    failures = Reporting(status=RevisionStatus(ActiveState()), metrics=Metrics(),
                         events=EventBus(), on_outage_change=outages.append)
    with structlog.testing.capture_logs() as logs:
        for poll in range(150):  # 150 polls, one a second, each with a new age
            failures.failed(_stale(poll), retry_in_s=1.0)
            await trio.sleep(1)
        failures.succeeded(active=1)
        failures.succeeded(active=1)  # a second success: nothing more to end
    lines = [(e["event"], e["log_level"]) for e in logs]
    assert outages == []  # no outage ended
    assert lines == [(BEGAN_UNASKED, "warning"), (BEGAN_UNASKED, "warning"),
                     (BEGAN_UNASKED, "warning"), (ENDED, "info")]
    progress = [e for e in logs if e["event"] == BEGAN_UNASKED][1:]
    assert [e["for_s"] for e in progress] == [60.0, 120.0]
    assert progress[-1]["detail"] == "the root's statement expired 120 s ago"  # the latest
    ended = logs[-1]
    assert ended["after_s"] == 150.0 and ended["attempts"] == 150 and ended["active"] == 1


async def test_another_reason_or_revision_begins_a_new_streak_at_once(
        autojump_clock: trio.testing.MockClock) -> None:
    outages: list[bool] = []
    failures = Reporting(status=RevisionStatus(ActiveState()), metrics=Metrics(),
                         events=EventBus(), on_outage_change=outages.append)
    secret = Outcome(OutcomeKind.REJECTED, revision=2, reason=reasons.SECRET, detail="unset")
    with structlog.testing.capture_logs() as logs:
        failures.failed(secret, retry_in_s=1.0)
        await trio.sleep(1)
        failures.failed(secret, retry_in_s=1.0)
        failures.failed(Outcome(OutcomeKind.REJECTED, revision=3, reason=reasons.SECRET,
                                detail="unset"), retry_in_s=1.0)
        failures.failed(Outcome(OutcomeKind.REJECTED, revision=3, reason=reasons.VALIDATION,
                                detail="bad"), retry_in_s=1.0)
        await trio.sleep(2)
        failures.succeeded(active=1)
    assert [(e["event"], e.get("revision"), e.get("reason")) for e in logs] == [
        (BEGAN, 2, "secret"), (BEGAN, 3, "secret"), (BEGAN, 3, "validation"), (ENDED, None, None)]
    assert all(e["log_level"] == "warning" for e in logs[:3])
    assert logs[-1]["after_s"] == 2.0
