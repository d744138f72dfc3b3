"""Bounds on what enters the process: the primitives every boundary uses.

A value from outside is bounded where it enters, by one of these: a capped read,
a range check, a cut text. The table of boundaries that use them is
:mod:`supervisor.boundaries`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

__all__ = ["DETAIL_BYTES", "OutOfRange", "TooLarge", "check_range", "check_size", "cut", "cut_read",
           "quoted", "read_capped"]

#: Every ``detail``, ``last_error`` and ``last_rejection`` fits in this many bytes.
DETAIL_BYTES: Final = 1024
#: A name from a revision, quoted inside a detail.
NAME_BYTES: Final = 128

N = TypeVar("N", int, float)


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

    N is the full length in bytes, so the reader knows how much was left out.
    """
    return cut_read(text, len(text.encode("utf-8", "surrogateescape")), limit)


def quoted(name: str, limit: int = NAME_BYTES) -> str:
    """A name from outside, quoted with escapes and cut: safe inside a one-line detail."""
    return cut(ascii(name), limit)


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
    if size <= limit:
        return head
    marker = f"… ({size} bytes)"
    room = max(limit - len(marker.encode()), 0)
    return head.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore") + marker
