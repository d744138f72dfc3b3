"""Bounds on what enters the process and on every wait: the primitives every boundary uses.

A value from outside is bounded where it enters, by one of these: a capped read,
a range check, a cut text. A blocking call waits in a worker thread of its
dependency's own limit, under a deadline (:func:`in_thread`). The table of
boundaries that use them is :mod:`supervisor.boundaries`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, Generic, Literal, TypeVar

import trio

from supervisor.logs import get_logger

__all__ = ["DETAIL_BYTES", "FILE_IO_DEADLINE_S", "MAX_SEQUENCE", "NAME_BYTES", "PATH_BYTES",
           "THREAD_LIMITS", "Dependency", "OutOfRange", "ThreadDeadline", "TooLarge",
           "check_range", "check_size", "cut", "cut_read", "in_thread", "outliving", "quoted",
           "read_capped", "shown", "thread_limiter"]

#: Every ``detail``, ``last_error`` and ``last_rejection`` fits in this many bytes.
DETAIL_BYTES: Final = 1024
#: A name from a revision, quoted inside a detail.
NAME_BYTES: Final = 128
#: A path (a token file, a secret file) shown inside a detail.
PATH_BYTES: Final = DETAIL_BYTES // 2
#: The highest sequence a signed statement carries (the control plane's CHECK, migration
#: 0003, holds the same); a higher one is malformed wherever it is read.
MAX_SEQUENCE: Final = 2**62

N = TypeVar("N", int, float)
T = TypeVar("T")


class TooLarge(Exception):
    """More than ``limit`` bytes came from ``what``; ``size`` is how many were seen."""

    def __init__(self, what: str, limit: int, size: int) -> None:
        self.what, self.limit, self.size = what, limit, size
        super().__init__(f"{what}: more than {limit} bytes")


class OutOfRange(Exception):
    """``value`` from ``what`` is outside ``[low, high]``."""

    def __init__(self, what: str, value: object, low: object, high: object) -> None:
        self.what, self.value, self.low, self.high = what, value, low, high
        super().__init__(f"{what}: {cut(repr(value), NAME_BYTES)} is outside {low}..{high}")


def cut(text: str, limit: int = DETAIL_BYTES) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes; a cut text ends ``… (N bytes)``.

    N is the full length in bytes, so the reader knows how much was left out (a
    limit too small for that ends ``…``, one under 3 bytes gives ``""``). A
    lone surrogate, which has no UTF-8, is shown as its escape (``\\udcff``).
    """
    shown = text.encode("utf-8", "backslashreplace")
    return cut_read(shown.decode(), len(shown), limit)


def quoted(name: str, limit: int = NAME_BYTES) -> str:
    """A name from outside, quoted with escapes and cut: safe inside a one-line detail."""
    return cut(ascii(name), limit)


def shown(text: str, limit: int = NAME_BYTES) -> str:
    """``text`` as it is when it is printable and fits ``limit`` bytes; :func:`quoted` else.

    For a name an operator wrote (a path, a parameter), shown as written when it
    is one plain line, and still safe inside a detail when it is not.
    """
    if text.isprintable() and len(text.encode("utf-8", "surrogatepass")) <= limit:
        return text
    return quoted(text, limit)


def check_range(what: str, value: N, low: N, high: N) -> N:
    """``value`` when ``low <= value <= high``; :class:`OutOfRange` otherwise."""
    if not low <= value <= high:
        raise OutOfRange(what, value, low, high)
    return value


def read_capped(read: Callable[[int], bytes], limit: int, what: str) -> bytes:
    """Everything ``read(n)`` gives until it returns ``b""``, at most ``limit`` bytes.

    Raises :class:`TooLarge` as soon as byte ``limit + 1`` arrives: never holds
    more than ``limit`` bytes plus one chunk.
    """
    chunks: list[bytes] = []
    total = 0
    while chunk := read(min(65536, limit + 1 - total)):
        total += len(chunk)
        if total > limit:
            raise TooLarge(what, limit, total)
        chunks.append(chunk)
    return b"".join(chunks)


def check_size(what: str, size: int, limit: int) -> int:
    """``size`` when at most ``limit`` bytes; :class:`TooLarge` otherwise.

    For a read in chunks: checked on the running total, so the chunk that
    crosses ``limit`` is refused before it is kept.
    """
    if size > limit:
        raise TooLarge(what, limit, size)
    return size


def cut_read(head: str, size: int, limit: int) -> str:
    """:func:`cut` for a text of which only ``head`` was read, ``size`` bytes in full.

    A boundary that bounds in the query (SQL's ``left``) reads the head and the
    length, never the whole text: the result is the one ``cut`` gives for it.
    """
    data = head.encode("utf-8", "backslashreplace")
    if size <= limit:
        return data.decode()
    # A limit too small for the length keeps the mark alone; one too small for
    # the mark keeps nothing, rather than a head that would pass for the whole.
    for marker in (f"… ({size} bytes)", "…"):
        room = limit - len(marker.encode())
        if room >= 0:
            return data[:room].decode("utf-8", "ignore") + marker
    return ""


# Thread hand-offs: every blocking call runs in a worker thread of its
# dependency's own limit, under a deadline.

#: Worker threads each dependency may hold at once. A thread abandoned at its
#: deadline keeps its token until its call returns, so a stuck dependency
#: exhausts its own limit and never trio's shared one (40), which the others
#: would wait on.
THREAD_LIMITS: Final[dict[Dependency, int]] = {
    "database": 8, "files": 4, "reload": 2, "kube": 2, "cpu": 4}
#: File I/O on a sink or a state file (a revision body written or read whole).
FILE_IO_DEADLINE_S: Final = 60.0

_limiters: trio.lowlevel.RunVar[dict[str, trio.CapacityLimiter]] = trio.lowlevel.RunVar(
    "thread_limiters")
_lock = threading.Lock()
_outliving: dict[str, int] = {}
_log = get_logger("threads")


class ThreadDeadline(TimeoutError):
    """``what`` did not return within ``deadline_s`` (waiting for a thread included)."""

    def __init__(self, what: str, deadline_s: float) -> None:
        self.what, self.deadline_s = what, deadline_s
        super().__init__(f"{what} timed out after {deadline_s:g} s")


def thread_limiter(dependency: Dependency) -> trio.CapacityLimiter:
    """The worker-thread limit of ``dependency`` (a key of :data:`THREAD_LIMITS`), per run."""
    try:
        limiters = _limiters.get()
    except LookupError:
        limiters = {}
        _limiters.set(limiters)
    if dependency not in limiters:
        limiters[dependency] = trio.CapacityLimiter(THREAD_LIMITS[dependency])
    return limiters[dependency]


def outliving() -> dict[str, int]:
    """Per dependency, the worker threads still running after their caller gave up."""
    with _lock:
        return {dep: n for dep, n in sorted(_outliving.items()) if n}


class _Handoff(Generic[T]):
    """One call in a worker thread; counted in :func:`outliving` once abandoned while running."""

    def __init__(self, fn: Callable[[], T], dependency: str, what: str) -> None:
        self.fn, self.dependency, self.what = fn, dependency, what
        self.started = self.done = False
        self.abandoned_at: float | None = None

    def run(self) -> T:
        with _lock:
            if self.done:
                # Given up between taking its token and starting: the caller has gone.
                raise ThreadDeadline(self.what, 0)
            self.started = True
        try:
            return self.fn()
        finally:
            with _lock:
                self.done = True
                late = self.abandoned_at
                if late is not None:
                    _outliving[self.dependency] -= 1
            if late is not None:
                _log.info("worker thread returned after its caller gave up",
                          dependency=self.dependency, what=self.what,
                          late_s=round(time.monotonic() - late, 3))

    def abandon(self) -> None:
        with _lock:
            if self.done or not self.started:
                # Never started (cancelled waiting for a token): it never will.
                self.done = True
                return
            self.abandoned_at = time.monotonic()
            _outliving[self.dependency] = _outliving.get(self.dependency, 0) + 1
        _log.info("worker thread still running after its caller gave up",
                     dependency=self.dependency, what=self.what)


async def in_thread(fn: Callable[[], T], *, dependency: Dependency, deadline_s: float,
                    what: str) -> T:
    """``fn()`` in a worker thread of ``dependency``'s limit, within ``deadline_s``.

    The deadline covers the wait for a thread too. At the deadline (then
    :class:`ThreadDeadline`) or on cancellation the caller returns at once and
    the thread runs on, holding its token, until ``fn`` returns: it is logged
    and counted in :func:`outliving` meanwhile. Releasing what blocks it (a
    socket shut down) is the caller's job.
    """
    handoff = _Handoff(fn, dependency, what)
    with trio.move_on_after(deadline_s):
        try:
            return await trio.to_thread.run_sync(
                handoff.run, abandon_on_cancel=True, limiter=thread_limiter(dependency))
        except trio.Cancelled:
            handoff.abandon()
            raise
    raise ThreadDeadline(what, deadline_s)


#: The names of :data:`THREAD_LIMITS`, as the type of a hand-off's ``dependency``: a
#: name not in the table fails the type check, not the first call.
Dependency = Literal["database", "files", "reload", "kube", "cpu"]
