"""Every subcommand and every option of the command line has help that helps.

Walks the real argparse parser, so a subcommand or option added later without
help fails here instead of shipping bare.
"""

from __future__ import annotations

import argparse
import re

import pytest

from supervisor.cli import _parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found.update({f"{name} {k}": v for k, v in _subcommands(sub).items()})
    return found


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]


PARSER = _parser()
SUBCOMMANDS = _subcommands(PARSER)


def test_there_are_subcommands_to_walk() -> None:
    assert {"run", "check", "db", "publish", "status", "watch", "keygen"} <= set(SUBCOMMANDS)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_description_examples_and_exit_codes(name: str) -> None:
    sub = SUBCOMMANDS[name]
    assert sub.description and len(sub.description.split()) >= 15, name
    text = sub.format_help()
    examples = text.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len([e for e in examples if "trio-supervisor" in e]) >= 2, text
    codes = text.split("exit codes:\n", 1)[1]
    assert re.search(r"^\s+0\s+\S", codes, re.M), text
    assert re.search(r"^\s+[12]\s+\S", codes, re.M), text


@pytest.mark.parametrize("name", ["<top>", *sorted(SUBCOMMANDS)])
def test_every_option_and_argument_has_help(name: str) -> None:
    parser = PARSER if name == "<top>" else SUBCOMMANDS[name]
    missing = [a.dest for a in _options(parser)
               if not a.help or a.help == argparse.SUPPRESS or len(a.help) < 10]
    assert not missing, f"{name}: no help for {missing}"


def test_every_subcommand_is_listed_with_a_summary() -> None:
    [action] = [a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)]
    listed = {choice.dest: choice.help for choice in action._choices_actions}
    assert set(listed) == {n for n in SUBCOMMANDS if " " not in n}
    assert all(listed.values()), listed


@pytest.mark.parametrize("name", ["<top>", *sorted(SUBCOMMANDS)])
def test_help_names_no_document_outside_the_repository(name: str) -> None:
    parser = PARSER if name == "<top>" else SUBCOMMANDS[name]
    assert "CONTRACT" not in parser.format_help()


def test_top_level_help_lists_the_exit_codes() -> None:
    text = PARSER.format_help()
    for code in "01234":
        assert re.search(rf"^\s+{code}\s+\S", text, re.M), text


def test_every_command_is_in_the_operations_command_table_with_its_exit_codes() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    table = page.split("\n## Commands\n", 1)[1].split("Exit codes:", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `trio-supervisor ")]
    named = {row.removeprefix("| `trio-supervisor ").split()[0].rstrip("`") for row in rows}
    names = {n.split()[0] for n in SUBCOMMANDS}
    assert names <= named, names - named
    assert "`trio-supervisor db prune" in table and "`trio-supervisor db migrate" in table
    for row in rows:
        # Each row: the command, what it does, and its exit codes (a cell starting with 0).
        assert row.rsplit(" | ", 1)[1].startswith("0"), row
