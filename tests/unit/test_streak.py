"""A streak of failures is said once at its start, at most once per interval while it
lasts, and once at its end (supervisor/streak.py), on a clock the test moves."""

from __future__ import annotations

from typing import Any

import structlog

from supervisor.streak import Streak


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def said(logs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event"], e["log_level"]) for e in logs]


def outage(clock: Clock, **options: Any) -> Streak:
    return Streak(structlog.get_logger(), began="x unreachable", ongoing="x still unreachable",
                  ended="x reachable again", clock=clock, **options)


def test_a_streak_is_its_first_failure_progress_once_per_interval_and_its_end() -> None:
    clock = Clock()
    streak = outage(clock, every_s=60.0)
    with structlog.testing.capture_logs() as logs:
        assert not streak.recovered()  # nothing to end
        logged = []
        for _ in range(13):  # every 10 s for two minutes
            logged.append(streak.failed(error="refused"))
            clock.now += 10.0
        assert streak.ongoing and streak.attempts == 13
        assert streak.recovered(active=3)
        assert not streak.recovered() and not streak.ongoing
    assert logged == [True, *[False] * 5, True, *[False] * 5, True]
    assert said(logs) == [("x unreachable", "warning"), ("x still unreachable", "warning"),
                          ("x still unreachable", "warning"), ("x reachable again", "info")]
    assert logs[0] == {"event": "x unreachable", "log_level": "warning", "error": "refused"}
    assert (logs[1]["attempts"], logs[1]["for_s"], logs[1]["error"]) == (7, 60.0, "refused")
    assert logs[-1] == {"event": "x reachable again", "log_level": "info", "after_s": 130.0,
                        "attempts": 13, "active": 3}


def test_after_its_end_the_next_failure_begins_a_new_streak() -> None:
    clock = Clock()
    streak = outage(clock)
    with structlog.testing.capture_logs() as logs:
        streak.failed()
        streak.recovered()
        clock.now += 1.0
        streak.failed()
        clock.now += 2.0
        streak.recovered()
    assert [e["event"] for e in logs] == ["x unreachable", "x reachable again"] * 2
    assert (logs[-1]["after_s"], logs[-1]["attempts"]) == (2.0, 1)


def test_without_an_ongoing_event_repeats_are_only_counted() -> None:
    clock = Clock()
    streak = Streak(structlog.get_logger(), began="failing", ended="recovered", clock=clock)
    with structlog.testing.capture_logs() as logs:
        for _ in range(100):
            streak.failed()
            clock.now += 10.0
        streak.recovered()
    assert [e["event"] for e in logs] == ["failing", "recovered"]
    assert logs[-1]["attempts"] == 100


def test_without_an_ended_event_the_end_is_silent_and_the_next_failure_is_said() -> None:
    clock = Clock()
    streak = Streak(structlog.get_logger(), began="refused", ongoing="refused", level="error",
                    clock=clock)
    with structlog.testing.capture_logs() as logs:
        streak.failed(reason="denied")
        clock.now += 60.0
        streak.failed(reason="denied")
        assert streak.recovered()
        streak.failed(reason="denied")
    assert said(logs) == [("refused", "error")] * 3
    assert (logs[1]["attempts"], logs[1]["for_s"]) == (2, 60.0)
    assert "attempts" not in logs[2]


def test_reset_ends_a_streak_without_a_line() -> None:
    streak = outage(Clock())
    with structlog.testing.capture_logs() as logs:
        streak.failed()
        streak.reset()
        assert not streak.ongoing and not streak.recovered()
        streak.failed()
    assert [e["event"] for e in logs] == ["x unreachable", "x unreachable"]


def test_with_quiet_s_only_a_success_that_long_after_the_last_failure_ends_it() -> None:
    clock = Clock()
    streak = Streak(structlog.get_logger(), began="full", ended="accepted again", quiet_s=1.0,
                    ended_level="warning", count_as="count", clock=clock)
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):  # failures interleaved with successes: one streak
            streak.failed(limit=4)
            clock.now += 0.5
            assert not streak.recovered(limit=4)
        clock.now += 0.5
        assert streak.recovered(limit=4)
    assert said(logs) == [("full", "warning"), ("accepted again", "warning")]
    assert logs[-1] == {"event": "accepted again", "log_level": "warning", "after_s": 3.0,
                        "count": 5, "limit": 4}
