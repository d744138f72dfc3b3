"""Docstrings and comments cite pages that exist in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for p in (ROOT / "supervisor").rglob("*") if p.suffix in (".py", ".sql")]


def test_every_cited_docs_page_exists() -> None:
    cited = {(path.relative_to(ROOT), page)
             for path in SOURCES
             for page in re.findall(r"docs/[a-z0-9-]+\.md", path.read_text(encoding="utf-8"))}
    assert cited, "no citations found: the pattern is wrong"
    missing = sorted((str(src), page) for src, page in cited if not (ROOT / page).is_file())
    assert missing == []


def test_nothing_cites_a_contract_file_outside_the_repository() -> None:
    offenders = [str(path.relative_to(ROOT)) for path in SOURCES
                 if "CONTRACT" in path.read_text(encoding="utf-8")]
    assert offenders == []
