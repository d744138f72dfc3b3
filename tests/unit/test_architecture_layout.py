"""docs/architecture.md's layout names every module of the package, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _package_part_of_the_layout() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    layout = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    package = layout.split("\n    supervisor/", 1)[1].split("\n    tools/", 1)[0]
    return package.split("\n", 1)[1]  # past the heading line, which cites a test


def _modules() -> set[str]:
    return {path.stem for path in (ROOT / "supervisor").rglob("*.py")
            if not path.stem.startswith("__")}


def test_every_module_of_the_package_is_in_the_layout() -> None:
    named = set(re.findall(r"([a-z_0-9]+)\.py", _package_part_of_the_layout()))
    assert _modules() - named == set(), "add them to the layout in docs/architecture.md"


def test_the_layout_names_no_module_the_package_lacks() -> None:
    named = set(re.findall(r"([a-z_0-9]+)\.py", _package_part_of_the_layout()))
    assert named - _modules() == set(), "remove them from the layout in docs/architecture.md"
