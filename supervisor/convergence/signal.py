"""The change signal: a hint that desired state may have changed, or a request to converge now.

:class:`ChangeSignal` is one memory channel into the convergence loop, for two kinds of
sender: fire and forget (:meth:`~ChangeSignal.notify`), or a caller that wants the
outcome (:meth:`~ChangeSignal.request`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import trio

__all__ = ["ChangeSignal", "ConvergeAnswer", "ConvergeRequest", "OutcomeLabel", "WakeupBatch"]

OutcomeLabel = Literal["published", "converged", "empty", "rejected", "failed"]


class ConvergeAnswer(msgspec.Struct, frozen=True):
    """What ``POST /v1/converge`` answers (docs/admin-api.md), encoded as it is."""

    outcome: OutcomeLabel
    revision: int | None = None
    reason: str | None = None


class ConvergeRequest:
    """One caller's wish for an attempt: an event, set once, and the answer it carries."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: ConvergeAnswer | None = None

    def resolve(self, answer: ConvergeAnswer) -> None:
        """Fill the slot and wake the caller; a second call changes nothing."""
        if not self.done.is_set():
            self.answer = answer
            self.done.set()


@dataclass
class WakeupBatch:
    """The wake-ups one attempt consumes: the trigger to run it with, and its waiters."""

    trigger: str
    requests: list[ConvergeRequest] = field(default_factory=list)

    def resolve(self, answer: ConvergeAnswer) -> None:
        for request in self.requests:
            request.resolve(answer)


# One channel item: (trigger, None) for fire-and-forget, ("request", request) otherwise.
_Item = tuple[str, ConvergeRequest | None]


class ChangeSignal:
    """Wake-ups for the convergence loop, coalesced; polling stays the correctness path.

    The loop takes them with :meth:`next_wakeup`: every one pending as one
    :class:`WakeupBatch`. So ten requests during one attempt are all served by the
    next. After that attempt, :meth:`WakeupBatch.resolve` answers them all. A wake-up
    during an attempt waits for the next one: the running attempt may have read the
    control plane before the change the caller cares about.
    """

    def __init__(self) -> None:
        # Unbounded, yet small: fire-and-forget senders keep at most one item in
        # it (``_plain_pending``), and requests are bounded by the admin API's
        # concurrent connections.
        self._send, self._receive = trio.open_memory_channel[_Item](math.inf)
        self._plain_pending = False
        # A SIGHUP coalesced into another pending wake-up: its trigger must win.
        self._sighup_coalesced = False
        self.sent = 0
        self.coalesced = 0
        self.requests = 0

    def notify(self, trigger: str = "notify") -> None:
        """Wake the loop now instead of at its next poll. Never blocks, never fails.

        For the LISTEN child, SIGHUP and a reconnect. At most one is pending: a burst
        is one attempt, with the first one's trigger. But a SIGHUP among them wins: the
        operator's "look again" forgets refusals, a notification does not. Only the
        trigger's name is carried. A lost signal costs at most one poll interval.
        """
        if self._plain_pending:
            self.coalesced += 1
            if trigger == "sighup":
                # SIGHUP means more than any other trigger (it forgets the
                # refusals): folded into a pending notification, it would be lost.
                self._sighup_coalesced = True
            return
        self._plain_pending = True
        self._send.send_nowait((trigger, None))
        self.sent += 1

    def request(self) -> ConvergeRequest:
        """Ask for an attempt that starts after this call; wait on ``.done`` for its answer.

        For ``POST /v1/converge``. The caller waits with its own deadline
        (:meth:`converge`); giving up never touches the loop, which answers anyway.
        """
        request = ConvergeRequest()
        self._send.send_nowait(("request", request))
        self.requests += 1
        return request

    async def converge(self, timeout_s: float) -> ConvergeAnswer | None:
        """Request an attempt and wait for its answer; None when ``timeout_s`` passed first.

        Cancelling or timing out only stops this caller waiting: the request
        stays queued and the loop resolves it as usual.
        """
        request = self.request()
        with trio.move_on_after(timeout_s):
            await request.done.wait()
        return request.answer

    async def next_wakeup(self) -> WakeupBatch:
        """Wait for a wake-up, then take every one pending as one :class:`WakeupBatch`.

        The trigger is the fire-and-forget one's when one is among them (SIGHUP's
        and a notification's mean something to the loop), else ``request``.
        """
        return self._take([await self._receive.receive()])

    def pending(self) -> WakeupBatch | None:
        """Take every pending wake-up without waiting (as :meth:`next_wakeup`); None if none."""
        try:
            first = self._receive.receive_nowait()
        except trio.WouldBlock:
            return None
        return self._take([first])

    def _take(self, items: list[_Item]) -> WakeupBatch:
        while True:
            try:
                items.append(self._receive.receive_nowait())
            except trio.WouldBlock:
                break
        self._plain_pending = False
        # At most one fire-and-forget wake-up is pending; its trigger wins over
        # "request", since it may change what the attempt does (SIGHUP forgets
        # refusals).
        plain = [trigger for trigger, request in items if request is None]
        trigger = plain[0] if plain else "request"
        if self._sighup_coalesced:
            trigger = "sighup"
            self._sighup_coalesced = False
        return WakeupBatch(trigger, [request for _, request in items if request is not None])

    async def wait(self) -> str:
        """Wait for the next wake-up and return its trigger (for fire-and-forget observers).

        Requests taken this way are answered ``failed`` at once: only the loop
        (:meth:`next_wakeup`) runs attempts for them.
        """
        wakeup = await self.next_wakeup()
        wakeup.resolve(ConvergeAnswer("failed"))
        return wakeup.trigger
