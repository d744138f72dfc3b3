"""README.rst's layout names every module of the package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout() -> str:
    text = (ROOT / "README.rst").read_text(encoding="utf-8")
    return text[text.index("\nLayout\n"):text.index("\nData paths")]


def test_every_module_of_the_package_is_in_the_layout() -> None:
    layout = _layout()
    named = set(re.findall(r"([a-z_0-9]+)\.py", layout))
    modules = {path.stem for path in (ROOT / "supervisor").rglob("*.py")
               if not path.stem.startswith("__")}
    assert modules - named == set(), "add them to README.rst's Layout"
