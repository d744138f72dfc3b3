"""What the repository must not carry: another package's internals, its own history."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Spelled in pieces, so that this file does not match itself.
HISTORY = re.compile("|".join([r"issue [0-9]+", "KNOW" + "-HOW", "CONTRACT" + r"\.md",
                               "the " + "seed"]))
HISTORY_NAMES = ("mutant", "adversar" + "y", "_more", "papercut", "truth", "day_two", "_parts")


def test_the_package_imports_no_private_module_of_hypercorn() -> None:
    found = []
    for path in sorted((ROOT / "supervisor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names
                      if n.split(".")[0] == "hypercorn"]
    assert not found, found


def test_no_file_cites_issue_numbers_or_outside_planning_notes() -> None:
    found = []
    for folder in ("supervisor", "tests", "docs", "conf", "deploy"):
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or path.suffix in (".pyc", ".db") or ".venv" in path.parts:
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            found += [f"{path.relative_to(ROOT)}:{n}" for n, line in
                      enumerate(text.splitlines(), 1) if HISTORY.search(line)]
    assert not found, found


def test_no_test_file_is_named_for_how_it_was_found() -> None:
    named = [p.name for p in (ROOT / "tests").rglob("test_*.py")
             if any(word in p.stem for word in HISTORY_NAMES)]
    assert not named, named
