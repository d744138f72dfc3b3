"""Writes that shutdown does not cut in half: a bounded drain.

Contract of :class:`Drain`: :meth:`Drain.write` runs one API write shielded
from cancellation. Run :meth:`Drain.guard` as a sibling task in the same
nursery: when that nursery is cancelled (shutdown, or losing leadership) the
guard gives every write in flight ``drain_s`` more to finish, and no new
write starts (:meth:`Drain.write` checks for cancellation before it begins).
A write still unfinished when the drain runs out is abandoned by the
cancellation, exactly as without the shield.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from supervisor.kube.errors import TransportError

__all__ = ["Drain"]

T = TypeVar("T")


class Drain:
    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        self.inflight: set[trio.CancelScope] = set()
        self.draining = False

    async def guard(self) -> None:
        """Sleep until cancelled; then start the drain clock of every write in flight."""
        try:
            await trio.sleep_forever()
        finally:
            self.draining = True
            deadline = trio.current_time() + self.drain_s
            for scope in self.inflight:
                scope.deadline = min(scope.deadline, deadline)

    async def write(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``await fn(*args, **kwargs)``, shielded but for the bounded drain."""
        await trio.lowlevel.checkpoint_if_cancelled()
        with trio.CancelScope(shield=True) as scope:
            if self.draining:
                scope.deadline = trio.current_time() + self.drain_s
            self.inflight.add(scope)
            try:
                return await fn(*args, **kwargs)
            finally:
                self.inflight.discard(scope)
        await trio.lowlevel.checkpoint()  # the drain ran out: our own cancellation lands here
        raise TransportError("write abandoned at shutdown")  # pragma: no cover
