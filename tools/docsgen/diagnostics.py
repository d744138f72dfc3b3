"""``docs/reasons.md`` and ``docs/log-events.md``: what the daemon says when something happens.

Reason labels come from :mod:`supervisor.reasons` (with what to do from
:mod:`tools.docs_catalog`); log events from every log call in the package
(:func:`tools.docsgen.sourcescan.log_calls`).
"""

from __future__ import annotations

from supervisor import reasons
from tools import docs_catalog
from tools.docsgen.common import HEADER, UNDESCRIBED, cell
from tools.docsgen.sourcescan import log_calls, modules

__all__ = ["render_log_events", "render_reasons"]


def render_reasons() -> str:
    out = [HEADER, "# Reason labels\n\n",
           "The `reason` field of log lines (`revision refused`, `convergence attempt "
           "failed`, `refused to boot`), `revision.last_rejection.reason` in `/status`, the "
           "`reason` label of `supervisor_revision_rejections_total`, and (fan-out) the "
           "`error_class` of preflight failures.\n\n",
           "| label | where | what happened | what to do |\n| --- | --- | --- | --- |\n"]
    rows: list[tuple[str, str]] = [(r, "revision") for r in reasons.REVISION_REASONS]
    rows += [(r, "boot") for r in reasons.BOOT_REFUSALS]
    rows += [(r, "fan-out") for r in reasons.FANOUT_ERROR_CLASSES]
    for label, where in rows:
        happened, todo = docs_catalog.REASONS.get(label, (UNDESCRIBED, UNDESCRIBED))
        out.append(f"| `{label}` | {where} | {cell(happened)} | {cell(todo)} |\n")
    return "".join(out)


def render_log_events() -> str:
    events: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
    for module, tree in modules():
        for event, level, keys in log_calls(tree):
            found = events.setdefault((event, level), (set(), set()))
            found[0].update(keys)
            found[1].add(module)
    out = [HEADER, "# Log events\n\n",
           "Every line the daemon logs, found in its source. Each line also carries "
           "`timestamp` (ISO-8601 UTC), `level`, `event`, usually `component`, and `child` "
           "inside a supervised child. With `[log].format = \"journal\"` the line starts with "
           "its syslog priority (`<2>` critical, `<3>` error, `<4>` warning, `<6>` info, "
           "`<7>` debug): `journalctl -u trio-supervisor -p err` shows errors and worse. "
           "Error-level lines from a traceback carry `exception`.\n\n",
           "| event | level | keys | logged by |\n| --- | --- | --- | --- |\n"]
    for (event, level), (found_keys, modules_) in sorted(events.items()):
        shown = ", ".join(f"`{k}`" for k in sorted(found_keys)) or "—"
        out.append(f"| {cell(event)} | {level} | {shown} | "
                   f"{', '.join(f'`{m}`' for m in sorted(modules_))} |\n")
    return "".join(out)
