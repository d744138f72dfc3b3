"""Text for a terminal from what others sent or stored: cells, blocks and aligned tables.

Anything others sent may hold any character: see :func:`printable`.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["block", "cell", "printable", "table"]


def printable(text: str) -> str:
    """``text`` with every non-printable character (newline, ANSI escape, BEL) a space:
    what a replica, or whatever answers on its port, sends cannot drive the terminal."""
    return "".join(c if c.isprintable() else " " for c in text)


def cell(value: object) -> str:
    """One table cell: ``-`` for None, otherwise :func:`printable` (one line per row)."""
    return "-" if value is None else printable(str(value))


def block(text: str) -> str:
    """Several lines of what others stored, each as a :func:`cell`: the newlines kept,
    every other non-printable character (ANSI escape, BEL) a space."""
    return "\n".join(cell(line) for line in text.split("\n"))


def table(header: Sequence[str], rows: Sequence[Sequence[object]],
          right: Sequence[int] = (), indent: str = "") -> list[str]:
    """Aligned columns, each a :func:`cell`, two spaces apart, each line after ``indent``
    with no trailing space; the columns named in ``right`` are right-aligned (numbers)."""
    cells = [[cell(c) for c in row] for row in [list(header), *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append((indent + "  ".join(parts)).rstrip())
    return lines
