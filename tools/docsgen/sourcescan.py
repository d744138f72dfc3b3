"""Facts read from the package's own syntax trees: log calls, stream events, Kubernetes Events.

Each scanner walks every module of :mod:`supervisor` and yields what one kind
of call says literally, so a new call shows up on its page without anyone
copying it into a table.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tools.docsgen.common import PACKAGE

__all__ = ["emitted_events", "kube_event_reasons", "log_calls", "modules", "non_constant_events",
           "notify_messages"]

LEVELS = ("debug", "info", "warning", "error", "critical", "exception")


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def modules() -> Iterator[tuple[str, ast.Module]]:
    """(dotted module name, syntax tree) of every module in the package, sorted by path."""
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        yield module, _tree(path)


def _dict_literals(tree: ast.Module) -> dict[str, set[str]]:
    """Names bound to a dict literal in ``tree``, with the literal's string keys."""
    dicts: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            dicts.setdefault(node.targets[0].id, set()).update(_keys(node.value))
    return dicts


def _keys(node: ast.Dict) -> set[str]:
    return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _log_call_nodes(tree: ast.Module) -> Iterator[ast.Call]:
    """Every ``<logger>.<level>(event, ...)`` call in ``tree``."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in LEVELS and node.args
                and "log" in ast.unparse(node.func.value).lower()):
            yield node


#: Where an event name is a parameter on purpose: each call site passes constants, which
#: :func:`log_calls` reads there (``OutageLog(log, "what")``, ``_Streak("a", "b")``).
EVENT_FORWARDERS = ("supervisor.outage", "supervisor.admin.accept")


def non_constant_events(module: str, tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, call) of every log call whose event is not a constant (or a choice of
    constants): an alert cannot match such an event, and this page cannot list it."""
    if module in EVENT_FORWARDERS:
        return
    for node in _log_call_nodes(tree):
        if not _constants(node.args[0]):
            yield node.lineno, ast.unparse(node)[:120]


def log_calls(tree: ast.Module) -> Iterator[tuple[str, str, list[str]]]:
    """(event, level, keys) of every ``<logger>.<level>("event", key=...)`` call in ``tree``
    (``"a" if ... else "b"`` is both events)."""
    # ``log.error("...", **fields)`` where ``fields = {...}`` in the same file.
    dicts = _dict_literals(tree)
    for call in _log_call_nodes(tree):
        keys = sorted(k.arg for k in call.keywords if k.arg and k.arg != "exc_info")
        for splat in (k.value for k in call.keywords if k.arg is None):
            keys += sorted(dicts.get(splat.id, set()) if isinstance(splat, ast.Name) else ())
        method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
        level = "error" if method == "exception" else method
        for event in _constants(call.args[0]):
            yield event, level, keys
    # An outage is logged by OutageLog(logger, "<what>") as three events
    # (supervisor/outage.py); the caller's fields come with the first two.
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "OutageLog" and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            what = node.args[1].value
            words = {k.arg: k.value.value for k in node.keywords
                     if k.arg in ("began", "ongoing", "ended")
                     and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)}
            # A streak that is not an outage has its own words and first fields (none).
            first = [] if words else ["detail", "error", "reason"]
            yield f"{what} {words.get('began', 'unreachable')}", "warning", first
            yield (f"{what} {words.get('ongoing', 'still unreachable')}", "warning",
                   ["attempts", "for_s"])
            yield f"{what} {words.get('ended', 'reachable again')}", "info", ["after_s", "attempts"]
    # A streak of failures (supervisor/admin/accept.py): _Streak("begins", "ends"), two
    # events (side_sinks.py's _Streak takes a sink's name, and logs constants itself).
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "_Streak" and len(node.args) == 2
                and all(_constants(arg) for arg in node.args)):
            for event in _constants(node.args[0]):
                yield event, "warning", ["error", "limit"]
            for event in _constants(node.args[1]):
                yield event, "warning", ["count", "limit"]


def emitted_events(tree: ast.Module) -> Iterator[str]:
    """The Struct name of every ``<...events>.emit(Name(...))`` call in ``tree``.

    These are the event bus's events (:mod:`supervisor.events`), which the
    WebSocket stream forwards as they are.
    """
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "emit" and len(node.args) == 1
                and "events" in ast.unparse(node.func.value)
                and isinstance(node.args[0], ast.Call)
                and isinstance(node.args[0].func, ast.Name)):
            yield node.args[0].func.id


def kube_event_reasons(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(type, reason) of every Kubernetes Event recorded: ``.event(obj, "Normal", "Reason", ...)``.

    The reason may also be a name bound in the same function to a constant or
    to ``"A" if ... else "B"`` (both are yielded).
    """
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        bound: dict[str, list[str]] = {}
        for node in ast.walk(func):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)):
                bound[node.targets[0].id] = _constants(node.value)
        for node in ast.walk(func):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "event" and len(node.args) >= 3):
                continue
            kind = node.args[1]
            if not (isinstance(kind, ast.Constant) and kind.value in ("Normal", "Warning")):
                continue
            reason = node.args[2]
            found = (bound.get(reason.id, []) if isinstance(reason, ast.Name)
                     else _constants(reason))
            for value in found:
                yield str(kind.value), value


def _constants(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _constants(node.body) + _constants(node.orelse)
    return []


def notify_messages(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(KEY, value) of every sd_notify line sent: ``<...>.send(READY="1", STATUS=text)``.

    A call counts when every keyword is an upper-case name (the notify
    protocol's keys); a value that is not a constant is shown as ``<text>``.
    """
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "send" and node.keywords and not node.args
                and all(k.arg and k.arg.isupper() for k in node.keywords)):
            continue
        for keyword in node.keywords:
            value = keyword.value
            shown = (value.value if isinstance(value, ast.Constant) and isinstance(value.value, str)
                     else "<text>")
            yield str(keyword.arg), shown
