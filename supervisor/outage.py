"""Logging an outage the way an operator wants to read it: start, progress, end.

A dependency that stays down (the control plane, the LISTEN connection) fails
once per retry. One warning per retry buries the log (a two-minute outage at a
0.25 s..30 s backoff is a dozen lines per component, and an operator cannot
tell from them when it ended). :class:`OutageLog` logs instead:

- the first failure, at once (warning), with whatever fields the caller gives;
- while it lasts, at most one line per ``every_s`` (warning) with the count of
  failed attempts and how long it has lasted;
- its end, once (info): ``<what> reachable again`` with ``after_s`` and
  ``attempts``.

The words after ``<what>`` are ``began``, ``ongoing`` and ``ended`` (defaults
``unreachable``, ``still unreachable``, ``reachable again``): a streak of
anything that is not an outage (a notification storm) is said the same way.

Time comes from trio's clock, so tests drive it with a ``MockClock``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

__all__ = ["OutageLog"]

#: At most one "still unreachable" line per minute per component.
PROGRESS_EVERY_S = 60.0


class OutageLog:
    """One component's outage, as log lines (see the module docstring)."""

    def __init__(
        self,
        logger: Any,
        what: str,
        *,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = trio.current_time,
        began: str = "unreachable",
        ongoing: str = "still unreachable",
        ended: str = "reachable again",
    ) -> None:
        self._log = logger
        self.what = what
        self._words = (began, ongoing, ended)
        self.every_s = every_s
        self._clock = clock
        self.since: float | None = None
        self.attempts = 0
        self._last_line = 0.0

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, **fields: Any) -> bool:
        """Count a failed attempt; return True when this one was logged."""
        now = self._clock()
        self.attempts += 1
        if self.since is None:
            self.since = now
            self._last_line = now
            self._log.warning(f"{self.what} {self._words[0]}", **fields)
            return True
        if now - self._last_line >= self.every_s:
            self._last_line = now
            self._log.warning(
                f"{self.what} {self._words[1]}",
                attempts=self.attempts,
                for_s=round(now - self.since, 1),
                **fields,
            )
            return True
        return False

    def recovered(self, **fields: Any) -> bool:
        """The dependency answered; log the end of an outage once. True when one ended."""
        if self.since is None:
            return False
        after = self._clock() - self.since
        self._log.info(
            f"{self.what} {self._words[2]}",
            after_s=round(after, 1),
            attempts=self.attempts,
            **fields,
        )
        self.since = None
        self.attempts = 0
        return True
