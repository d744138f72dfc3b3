"""``docs/README.md``: the index, one line per page (what it says from docs_catalog.PAGES)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tools import docs_catalog
from tools.docsgen.common import HEADER, UNDESCRIBED

__all__ = ["render_index"]


def render_index(pages: Mapping[str, Callable[[], str]]) -> str:
    out = [HEADER, "# trio-supervisor reference\n\n",
           "What the daemon promises to operators, scripts and data-plane consumers, "
           "generated from the code that keeps each promise (`python -m tools.docsgen`; "
           "a test fails when a page is stale). `README.rst` at the top of the repository "
           "explains how to run it.\n\n"]
    for name in pages:
        if name == "README.md":
            continue
        out.append(f"- [{name}]({name}): {docs_catalog.PAGES.get(name, UNDESCRIBED)}\n")
    return "".join(out)
