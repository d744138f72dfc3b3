"""Generate the reference pages in ``docs/`` from the code they document.

``python -m tools.docsgen`` rewrites them; ``python -m tools.docsgen
--check`` exits 1 naming every page that differs from what the code says (the
test suite runs the same comparison). One module per group of pages, each
reading the code that implements what it documents, never a copied table:

- :mod:`.settings`: ``configuration.md`` and ``revision-schema.md`` (msgspec Structs);
- :mod:`.diagnostics`: ``reasons.md`` (:mod:`supervisor.reasons`) and
  ``log-events.md`` (every log call, found in the syntax trees);
- :mod:`.process`: ``commands.md`` (the real argparse parser of :mod:`supervisor.cli`)
  and ``exit-codes.md`` (the ``EXIT_*`` constants, the exceptions :mod:`supervisor.cli`
  maps to them, the signals of :mod:`supervisor.lifecycle.signals`);
- :mod:`.metrics`: ``metrics.md`` (a real :class:`~supervisor.telemetry.Metrics` registry);
- :mod:`.adminapi`: ``admin-api.md`` (the admin app's route table, the ``/status``
  catalogue a test holds to a real document, the stream events found in the source);
- :mod:`.controlplane`: ``control-plane.md`` (the SQL migrations);
- :mod:`.kubernetes`: ``kubernetes.md`` (the fan-out kinds, labels, annotations, Events);
- :mod:`.boundaries`: ``boundaries.md`` (:data:`tools.boundary_table.BOUNDARIES`);
- :mod:`.index`: ``README.md``, one line per page.

The prose (what a key means, what to do about a label) is in
:mod:`tools.docs_catalog`, keyed by name.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

from tools.docsgen.adminapi import render_admin_api
from tools.docsgen.boundaries import render_boundaries
from tools.docsgen.common import DOCS
from tools.docsgen.controlplane import render_control_plane
from tools.docsgen.diagnostics import render_log_events, render_reasons
from tools.docsgen.index import render_index
from tools.docsgen.kubernetes import render_kubernetes
from tools.docsgen.metrics import render_metrics
from tools.docsgen.process import render_commands, render_exit_codes
from tools.docsgen.settings import render_configuration, render_revision_schema

__all__ = [
    "DOCS", "PAGES", "check", "main", "render_admin_api", "render_all", "render_boundaries",
    "render_commands",
    "render_configuration", "render_control_plane", "render_exit_codes", "render_index",
    "render_kubernetes", "render_log_events", "render_metrics", "render_reasons",
    "render_revision_schema", "write",
]

PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": render_configuration,
    "commands.md": render_commands,
    "exit-codes.md": render_exit_codes,
    "revision-schema.md": render_revision_schema,
    "control-plane.md": render_control_plane,
    "admin-api.md": render_admin_api,
    "metrics.md": render_metrics,
    "kubernetes.md": render_kubernetes,
    "reasons.md": render_reasons,
    "log-events.md": render_log_events,
    "boundaries.md": render_boundaries,
}
# The index lists the pages above (it reads PAGES, so it comes last).
PAGES["README.md"] = lambda: render_index(PAGES)


def render_all() -> dict[str, str]:
    """Every page, rendered once per process (a render walks the package's syntax trees
    for seconds; the source does not change under a running check)."""
    return dict(_rendered())


@cache
def _rendered() -> dict[str, str]:
    return {name: render() for name, render in PAGES.items()}


def check(docs: Path = DOCS) -> list[str]:
    """Names of the pages in ``docs`` that differ from what the code says."""
    stale = []
    for name, text in render_all().items():
        path = docs / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def write(docs: Path = DOCS) -> None:
    docs.mkdir(exist_ok=True)
    for name, text in render_all().items():
        (docs / name).write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m tools.docsgen",
                                     description="Regenerate (or --check) docs/.")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 naming the pages that differ from the code")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        for name in stale:
            print(f"docs/{name} is stale: run python -m tools.docsgen", file=sys.stderr)
        return 1 if stale else 0
    write()
    return 0
