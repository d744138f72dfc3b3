"""Bounds on what enters the process: a capped read, a range check, a cut text.

A value from outside is bounded where it enters, by one of these. Waits are
bounded by :mod:`supervisor.threads`; the table of boundaries that use both is
``tools/boundary_table.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

__all__ = ["DETAIL_BYTES", "MAX_SEQUENCE", "NAME_BYTES", "PATH_BYTES", "OutOfRange",
           "TooLarge", "check_range", "check_size", "cut", "cut_read", "quoted", "read_capped",
           "shown"]

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
