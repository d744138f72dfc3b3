"""``trio-supervisor status`` as text: the ``/status`` document rendered for people.

:func:`render_status` renders it; :func:`unhealthy` says why the replica is not healthy
(the command's exit 1).
"""

from __future__ import annotations

from typing import Any

from supervisor.texttable import cell, table

__all__ = ["render_status", "unhealthy"]


def _cell(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else cell(value)


def _seconds(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.3f} s"


def _yes_no(value: Any) -> str:
    return "-" if not isinstance(value, bool) else ("yes" if value else "NO")


def _table(doc: dict[str, Any], section: str, headings: tuple[str, ...],
           keys: tuple[str, ...]) -> list[str]:
    """``section``'s title line, then its table (one row per name) or ``(none)``."""
    parts = doc.get(section)
    if not isinstance(parts, dict) or not parts:
        return [section, "  (none)"]
    rows = [[_cell(name), *((_cell(part.get(k)) for k in keys) if isinstance(part, dict)
                            else ["-"] * len(keys))]
            for name, part in parts.items()]
    return [section, *table(headings, rows, indent="  ")]


def unhealthy(doc: dict[str, Any]) -> list[str]:
    """Why the replica behind a ``/status`` document is not healthy; empty when it is.

    Not ready (no active snapshot) or a supervised child failed for good: what
    ``trio-supervisor status`` turns into exit 1, so scripts can use it as a check.
    """
    problems: list[str] = []
    rev = doc.get("revision")
    if not isinstance(rev, dict) or rev.get("active") is None:
        problems.append("not ready: no active snapshot")
    children = doc.get("children")
    if isinstance(children, dict):
        problems += [f"child {name} has failed" for name, child in sorted(children.items())
                     if isinstance(child, dict) and child.get("state") == "failed"]
    return problems


def render_status(doc: dict[str, Any]) -> str:
    """A human rendering of the ``/status`` document, as a readable block.

    The revision lines, then a children table, a fan-out table and the leadership line.
    Missing keys show as ``-``, so it renders an older or newer replica's document too.
    """
    raw_rev = doc.get("revision")
    rev: dict[str, Any] = raw_rev if isinstance(raw_rev, dict) else {}
    lines = [
        "revision",
        "  desired {}  loaded {}  active {}  generation {}  source {}".format(
            *(_cell(rev.get(k)) for k in ("desired", "loaded", "active", "generation", "source"))),
        "  lag {}  last convergence {}  consecutive failures {}".format(
            _seconds(rev.get("lag_s")), _seconds(rev.get("last_convergence_s")),
            _cell(rev.get("consecutive_failures"))),
        "  control plane up {}  last error {}".format(_yes_no(rev.get("control_plane_up")),
                                                      _cell(rev.get("last_error"))),
    ]
    rejection = rev.get("last_rejection")
    if isinstance(rejection, dict):
        lines.append(
            "  last rejection: revision {} ({}) at {}: {}".format(
                *(_cell(rejection.get(k)) for k in ("revision", "reason", "at", "detail")))
        )
    else:
        lines.append("  last rejection: none")

    lines += _table(doc, "children", ("NAME", "STATE", "RESTARTS", "LAST ERROR"),
                    ("state", "restarts", "last_error"))
    lines += _table(doc, "fanout", ("KIND", "STATE", "OBJECTS", "LAST ERROR CLASS"),
                    ("state", "objects", "last_error_class"))
    leadership = doc.get("leadership")
    if isinstance(leadership, dict):  # absent from replicas without an election
        lines.append("leadership: {}  holder {}  lease {}".format(
            *(_cell(leadership.get(k)) for k in ("role", "holder", "lease"))))
    if "version" in doc:  # absent from older replicas
        lines.append(f"version {_cell(doc.get('version'))}  started {_cell(doc.get('started_at'))}")
    return "\n".join(lines) + "\n"
