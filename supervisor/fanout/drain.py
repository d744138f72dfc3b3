"""Writes that shutdown does not cut in half: :class:`Drain`, a bounded drain."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from supervisor.kube.errors import TransportError

__all__ = ["Drain"]

T = TypeVar("T")


class Drain:
    """API writes shielded from cancellation, with ``drain_s`` to finish at shutdown.

    Run :meth:`guard` as a sibling task in the writers' nursery. When that nursery is
    cancelled (shutdown, or losing leadership), every write in flight gets ``drain_s``
    more, and no new write starts. A write unfinished when the drain runs out is
    abandoned by the cancellation, as without the shield.
    """

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
