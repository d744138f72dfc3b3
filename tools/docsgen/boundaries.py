"""``boundaries.md``: where data enters or the process waits (tools.boundary_table)."""

from __future__ import annotations

from tools.boundary_table import BOUNDARIES
from tools.docsgen.common import HEADER, code, table

__all__ = ["render_boundaries"]


def render_boundaries() -> str:
    rows = [(b.where, b.enters, b.size, b.check, b.deadline, b.released, code(b.reason),
             code(b.test)) for b in BOUNDARIES]
    return (HEADER + "# Boundaries\n\n"
            "Every place a value from outside enters the process, or the process waits on "
            "something outside it: the bound on its size, the check on its range or shape, "
            "its deadline and what that deadline releases, the reason a refusal carries "
            "([reasons.md](reasons.md)) and the test that proves it. Rendered from "
            "`tools/boundary_table.py`.\n\n"
            + table(("where", "what enters", "size", "check", "deadline", "released",
                     "reason", "test"), rows))
