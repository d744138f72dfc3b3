"""A streak of failures said the way an operator wants to read it: start, progress, end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

__all__ = ["PROGRESS_EVERY_S", "Streak"]

#: At most one progress line per minute per streak.
PROGRESS_EVERY_S = 60.0


class Streak:
    """One streak of failures, as log lines: one when it begins, few while it lasts, one at its end.

    A dependency that stays down fails once per retry. One line per failure buries the
    log, and an operator cannot tell when the outage ended. So :class:`Streak` logs:

    - its first failure, at once (``began``, at ``level``), with the caller's fields;
    - while it lasts, at most one line per ``every_s`` (``ongoing``; none when None),
      with the failures so far (``attempts``), ``for_s`` and the caller's fields;
    - its end, once (``ended``, at ``ended_level``; none when None), with ``after_s`` and
      its failures (``attempts``, or the name ``count_as`` gives).

    With ``quiet_s``, only a success that long after the last failure ends it: failures
    interleaved with successes (a flood at a limit) are one streak. Each event is a
    constant the caller passes, so an alert matches it and the log-events page lists it.
    Time is trio's clock: tests drive it with a ``MockClock``.
    """

    def __init__(self, logger: Any, *, began: str, ongoing: str | None = None,
                 ended: str | None = None, every_s: float = PROGRESS_EVERY_S, quiet_s: float = 0.0,
                 level: str = "warning", ended_level: str = "info", count_as: str = "attempts",
                 clock: Callable[[], float] = trio.current_time) -> None:
        self._log = logger
        self._began, self._ongoing, self._ended = began, ongoing, ended
        self._level, self._ended_level, self._count_as = level, ended_level, count_as
        self.every_s = every_s
        self.quiet_s = quiet_s
        self._clock = clock
        self.since: float | None = None
        self.attempts = 0
        self._last_line = 0.0
        self._last_failure = 0.0

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, **fields: Any) -> bool:
        """Count a failure; return True when this one was logged."""
        now = self._last_failure = self._clock()
        self.attempts += 1
        if self.since is None:
            self.since = self._last_line = now
            getattr(self._log, self._level)(self._began, **fields)
            return True
        if self._ongoing is not None and now - self._last_line >= self.every_s:
            self._last_line = now
            getattr(self._log, self._level)(self._ongoing, attempts=self.attempts,
                                            for_s=round(now - self.since, 1), **fields)
            return True
        return False

    def recovered(self, **fields: Any) -> bool:
        """A success: end the streak (logged once), unless it failed within ``quiet_s``.

        True when one ended.
        """
        now = self._clock()
        if self.since is None or now - self._last_failure < self.quiet_s:
            return False
        if self._ended is not None:
            getattr(self._log, self._ended_level)(self._ended, after_s=round(now - self.since, 1),
                                                  **{self._count_as: self.attempts}, **fields)
        self.reset()
        return True

    def reset(self) -> None:
        """End the streak without a line: the next failure begins a new one."""
        self.since = None
        self.attempts = 0
