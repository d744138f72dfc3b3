"""README.rst renders without a single docutils warning (a malformed table fails here)."""

from __future__ import annotations

import io
from pathlib import Path

import docutils.core

README = Path(__file__).resolve().parents[2] / "README.rst"


def test_the_readme_renders_cleanly() -> None:
    warnings = io.StringIO()
    docutils.core.publish_doctree(
        README.read_text(encoding="utf-8"),
        settings_overrides={"warning_stream": warnings, "report_level": 2, "halt_level": 5},
    )
    assert warnings.getvalue() == ""
