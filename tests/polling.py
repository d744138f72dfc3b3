"""Bounded polling of outside state that no event reports.

Tests wait on events wherever one exists (log lines, stream messages, the fake
API server's ``wait_until``). A few conditions live only in another process's
view, such as a PostgreSQL backend waiting on a lock in ``pg_stat_activity``:
those are polled here, at one documented cadence, always under the caller's
``trio.fail_after``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

# How often outside state is re-read: short against the tests' deadlines, long
# enough not to load the server being observed.
POLL_INTERVAL_S = 0.02


async def poll_until(predicate: Callable[[], bool | Awaitable[bool]]) -> None:
    """Return once ``predicate()`` (sync or async) is true; the caller bounds the wait."""
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        await trio.sleep(POLL_INTERVAL_S)
