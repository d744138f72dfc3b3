"""``docs/commands.md`` and ``docs/exit-codes.md``: the process as scripts see it.

- Commands: the real parser (:func:`supervisor.cli._parser`) is walked, so every
  subcommand and option is listed with the help text it shows; summaries,
  examples and exit codes per command come from :mod:`supervisor.cli_help`.
- Exit codes: the ``EXIT_*`` constants of :mod:`supervisor.commands.common`; the
  exceptions :func:`supervisor.cli._report` maps to them, read from its syntax
  tree; the signals of :mod:`supervisor.lifecycle.signals`; the ``sd_notify``
  lines found in the source (:func:`~tools.docsgen.sourcescan.notify_messages`).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
from collections.abc import Iterator

from supervisor import cli, cli_help, errors
from supervisor.commands import common
from supervisor.controlplane import errors as store_errors
from supervisor.lifecycle import signals
from tools import docs_catalog
from tools.docsgen.common import HEADER, UNDESCRIBED, code, table
from tools.docsgen.sourcescan import modules, notify_messages

__all__ = ["exception_exits", "exit_constants", "render_commands", "render_exit_codes",
           "subcommands"]


# -- the parser ---------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    return cli._parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Name → parser of every subcommand, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Name → the one-line help the top-level ``--help`` lists for each subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: str(a.help) for a in action._choices_actions if a.help}
    return {}


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        yield action


def _metavar(action: argparse.Action) -> str:
    if action.choices is not None and action.metavar is None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    if action.metavar is not None:
        return str(action.metavar)
    return action.dest.upper() if action.option_strings else action.dest


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _spelling(action: argparse.Action) -> str:
    if not action.option_strings:
        return _metavar(action)
    flags = ", ".join(action.option_strings)
    return f"{flags} {_metavar(action)}" if _takes_value(action) else flags


def _usage(name: str, parser: argparse.ArgumentParser) -> str:
    words = ["trio-supervisor", name]
    for action in _options(parser):
        if isinstance(action, argparse._VersionAction):
            continue
        spelled = (f"{action.option_strings[0]} {_metavar(action)}"
                   if action.option_strings and _takes_value(action)
                   else action.option_strings[0] if action.option_strings
                   else _metavar(action))
        if action.nargs in ("*", "+") or isinstance(action, argparse._AppendAction):
            spelled += " ..."
        optional = (not action.required if action.option_strings
                    else action.nargs in ("?", "*"))
        words.append(f"[{spelled}]" if optional else spelled)
    return " ".join(words)


def _default(action: argparse.Action) -> str:
    if action.required or action.default in (None, False, argparse.SUPPRESS):
        return "required" if action.required else "—"
    return code(action.default)


def _help(action: argparse.Action) -> str:
    return " ".join(str(action.help or UNDESCRIBED).split())


def _options_table(parser: argparse.ArgumentParser) -> str:
    rows = [(code(_spelling(action)), _default(action), _help(action))
            for action in _options(parser)]
    return table(("option", "default", "meaning"), rows)


def render_commands() -> str:
    parser = _parser()
    summaries = _summaries(parser)
    out = [HEADER, "# Commands\n\n",
           "Every subcommand of `trio-supervisor` and every option, read from the parser "
           "the program runs (`trio-supervisor COMMAND --help` shows the same words, with "
           "examples). Without a subcommand it runs the daemon (`run`); `python -m "
           "supervisor` is the same program. Options of the program itself:\n\n",
           _options_table(parser), "\n",
           table(("command", "does"),
                 [(f"[`{name}`](#{name})", summaries.get(name) or UNDESCRIBED)
                  for name in subcommands(parser)])]
    for name, sub in subcommands(parser).items():
        out.append(f"\n## {name}\n\n")
        out.append("```\n" + _usage(name, sub) + "\n```\n\n")
        out.append(" ".join(str(sub.description or UNDESCRIBED).split()) + "\n\n")
        out.append(_options_table(sub))
        words = cli_help.COMMANDS.get(name)
        if words is not None:
            out.append("\nExamples:\n\n```\n" + "\n".join(words.examples) + "\n```\n\n")
            out.append(table(("exit", "when"), [(code(c), m) for c, m in words.exits]))
    return "".join(out)


# -- exit codes and signals -----------------------------------------------------------


def exit_constants() -> dict[str, int]:
    """``EXIT_*`` name → code, as :mod:`supervisor.commands.common` defines them."""
    return {name: value for name, value in vars(common).items()
            if name.startswith("EXIT_") and isinstance(value, int)}


def exception_exits() -> list[tuple[list[str], str]]:
    """([exception names], EXIT_* name) in the order :func:`supervisor.cli._report` checks them.

    Read from its syntax tree: each ``found = find_leaf(exc, (A, B))`` followed by
    an ``if found is not None:`` block returning ``EXIT_X``.
    """
    source = textwrap.dedent(inspect.getsource(cli._report))
    func = ast.parse(source).body[0]
    assert isinstance(func, ast.FunctionDef)
    found: list[tuple[list[str], str]] = []
    kinds: list[str] = []
    for stmt in func.body:
        call = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "find_leaf" and len(call.args) == 2):
            kinds_node = call.args[1]
            elts = kinds_node.elts if isinstance(kinds_node, ast.Tuple) else [kinds_node]
            kinds = [ast.unparse(e) for e in elts]
        elif isinstance(stmt, ast.If) and kinds:
            returned = _returned_exit(stmt.body)
            if returned is not None:
                found.append((kinds, returned))
            kinds = []
    return found


def _returned_exit(body: list[ast.stmt]) -> str | None:
    for node in body:
        for sub in ast.walk(node):
            if (isinstance(sub, ast.Return) and isinstance(sub.value, ast.Name)
                    and sub.value.id.startswith("EXIT_")):
                return sub.value.id
    return None


def _first_line(name: str) -> str:
    """The first line of the docstring of the error ``name`` (``supervisor.errors`` or the
    control plane's), in Markdown."""
    kind = getattr(errors, name, None) or getattr(store_errors, name, None)
    doc = inspect.getdoc(kind) if kind is not None else None
    return doc.splitlines()[0].replace("``", "`") if doc else UNDESCRIBED


def render_exit_codes() -> str:
    constants = exit_constants()
    process = dict(cli_help.EXIT_CODES)
    users: dict[int, list[str]] = {}
    for name, words in cli_help.COMMANDS.items():
        for exit_code, _ in words.exits:
            users.setdefault(exit_code, []).append(name)
    rows = []
    for name, value in sorted(constants.items(), key=lambda item: item[1]):
        meaning = process.get(value) or "; ".join(
            f"{command}: {text}" for command, words in cli_help.COMMANDS.items()
            for c, text in words.exits if c == value) or UNDESCRIBED
        rows.append((code(value), code(name), meaning,
                     ", ".join(f"[`{c}`](commands.md#{c})" for c in users.get(value, []))))
    out = [HEADER, "# Exit codes, signals and systemd\n\n",
           "How the process ends, the signals it answers, and what it tells systemd. The "
           "codes are the `EXIT_*` constants of `supervisor/commands/common.py`; what each "
           "command means by them is in [commands.md](commands.md).\n\n",
           table(("code", "constant", "meaning", "commands"), rows),
           "\n## Which error ends in which code\n\n",
           "The daemon and every command map the first error of these kinds found (inside "
           "exception groups too) to an exit code, in this order; anything else exits "
           f"{constants.get('EXIT_ERROR', 1)}.\n\n"]
    exits = [(code(kind), code(constants.get(exit_name, exit_name)), _first_line(kind))
             for kinds, exit_name in exception_exits() for kind in kinds]
    out.append(table(("error", "exit", "what it means"), exits))
    out.append("\n## Signals\n\n"
               "Handled from the first moment of `run` (as PID 1 the kernel drops signals "
               "without a handler); any other signal has its default action.\n\n")
    out.append(table(("signal", "what the daemon does"),
                     [(code(sig.name), docs_catalog.SIGNALS.get(sig.name, UNDESCRIBED))
                      for sig in signals.HANDLED]))
    out.append("\n## Under systemd\n\n"
               "When `NOTIFY_SOCKET` is set (`Type=notify`), the daemon sends these "
               "`sd_notify` lines (found in the source); without it, nothing.\n\n")
    sent: dict[str, tuple[set[str], set[str]]] = {}
    for module, tree in modules():
        for key, line_value in notify_messages(tree):
            entry = sent.setdefault(key, (set(), set()))
            entry[0].add(line_value)
            entry[1].add(module)
    out.append(table(("line", "when", "sent by"),
                     [(", ".join(code(f"{key}={v}") for v in sorted(values)),
                       docs_catalog.SYSTEMD.get(key, UNDESCRIBED),
                       ", ".join(code(m) for m in sorted(mods)))
                      for key, (values, mods) in sorted(sent.items())]))
    return "".join(out)
