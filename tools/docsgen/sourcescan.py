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


def _streaks(node: ast.AST) -> Iterator[ast.Call]:
    """Every ``Streak(...)`` call in ``node`` (:class:`supervisor.streak.Streak`)."""
    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "Streak"):
            yield call


def non_constant_events(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, call) of every log call (or :class:`~supervisor.streak.Streak`) whose event
    is not a constant (or a choice of constants): an alert cannot match such an event,
    and this page cannot list it."""
    for node in _log_call_nodes(tree):
        if not _constants(node.args[0]):
            yield node.lineno, ast.unparse(node)[:120]
    for node in _streaks(tree):
        events = [k.value for k in node.keywords if k.arg in ("began", "ongoing", "ended")]
        if not all(_constants(event) for event in events):
            yield node.lineno, ast.unparse(node)[:120]


def _call_keys(call: ast.Call, dicts: dict[str, set[str]]) -> list[str]:
    """The keyword names ``call`` passes, ``**name`` resolved from ``dicts``."""
    keys = sorted(k.arg for k in call.keywords if k.arg and k.arg != "exc_info")
    for splat in (k.value for k in call.keywords if k.arg is None):
        keys += sorted(dicts.get(splat.id, set()) if isinstance(splat, ast.Name) else ())
    return keys


def _bound_name(node: ast.expr) -> str | None:
    """``name``, ``<...>.name`` or ``<...>.name[...]``: the name (None otherwise)."""
    if isinstance(node, ast.Subscript):
        return _bound_name(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _streak_calls(tree: ast.Module,
                  dicts: dict[str, set[str]]) -> Iterator[tuple[str, str, list[str]]]:
    """(event, level, keys) of each :class:`~supervisor.streak.Streak` made in ``tree``.

    The caller's keys are those of the ``.failed()`` and ``.recovered()`` calls in
    the same module on the name the streak is bound to (``self.outage = Streak(...)``,
    then ``self.outage.failed(error=...)``).
    """
    made = [(_bound_name(node.targets[0]), call) for node in ast.walk(tree)
            if isinstance(node, ast.Assign) for call in _streaks(node.value)]
    passed: dict[tuple[str | None, str], set[str]] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("failed", "recovered")):
            passed.setdefault((_bound_name(node.func.value), node.func.attr), set()).update(
                _call_keys(node, dicts))
    for name, call in made:
        # Its events, levels and own fields (supervisor/streak.py), with their defaults.
        said = {k.arg: _constants(k.value) for k in call.keywords if k.arg}
        level, ended_level, count = ((said.get(k) or [default])[0] for k, default in (
            ("level", "warning"), ("ended_level", "info"), ("count_as", "attempts")))
        failed = passed.get((name, "failed"), set())
        recovered = passed.get((name, "recovered"), set())
        for keyword, at, keys in (("began", level, failed),
                                  ("ongoing", level, {*failed, "attempts", "for_s"}),
                                  ("ended", ended_level, {*recovered, "after_s", count})):
            for event in said.get(keyword, []):
                yield event, at, sorted(keys)


def log_calls(tree: ast.Module) -> Iterator[tuple[str, str, list[str]]]:
    """(event, level, keys) of every ``<logger>.<level>("event", key=...)`` call in ``tree``
    (``"a" if ... else "b"`` is both events), and of every streak's events."""
    # ``log.error("...", **fields)`` where ``fields = {...}`` in the same file.
    dicts = _dict_literals(tree)
    for call in _log_call_nodes(tree):
        method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
        level = "error" if method == "exception" else method
        for event in _constants(call.args[0]):
            yield event, level, _call_keys(call, dicts)
    yield from _streak_calls(tree, dicts)


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
