"""``docs/README.md``: the index, one line per page (what it says from docs_catalog.PAGES)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tools import docs_catalog
from tools.docsgen.common import HEADER, UNDESCRIBED

__all__ = ["HAND_WRITTEN", "render_index"]

#: The pages written by hand (not generated), each with what it says.
HAND_WRITTEN = {
    "operations.md": "running a replica: configuration, commands, signals, systemd, containers, "
    "Kubernetes, high availability, security, fleets, upgrades, troubleshooting.",
    "architecture.md": "the layout of the package, the supervision tree, and two walks "
    "through the code: the poll interval, and a revision from the database to the sinks.",
    "benchmarks.md": "every measured figure, next to the floor measured in the same run.",
}


def render_index(pages: Mapping[str, Callable[[], str]]) -> str:
    out = [HEADER, "# trio-supervisor reference\n\n",
           "What the daemon promises to operators, scripts and data-plane consumers, "
           "generated from the code that keeps each promise (`python -m tools.docsgen`; "
           "a test fails when a page is stale). `README.rst` at the top of the repository "
           "has the quick starts. Written by hand:\n\n"]
    for name, says in HAND_WRITTEN.items():
        out.append(f"- [{name}]({name}): {says}\n")
    out.append("\nGenerated:\n\n")
    for name in pages:
        if name == "README.md":
            continue
        out.append(f"- [{name}]({name}): {docs_catalog.PAGES.get(name, UNDESCRIBED)}\n")
    return "".join(out)
