"""Children for the supervision tree's tests (they run under virtual time)."""

from __future__ import annotations

import trio


class Crasher:
    """A child that starts, then crashes after ``after_s``; records its start times."""

    def __init__(self, after_s: float = 1.0, crashes: int = 10**9) -> None:
        self.after_s = after_s
        self.crashes = crashes
        self.starts: list[float] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(trio.current_time())
        task_status.started()
        await trio.sleep(self.after_s)
        if len(self.starts) <= self.crashes:
            raise RuntimeError(f"crash #{len(self.starts)}")
        await trio.sleep_forever()
