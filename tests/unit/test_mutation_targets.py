"""The mutation groups name files that exist: a renamed test file or module is followed there."""

from __future__ import annotations

from pathlib import Path

from tests.mutation.runner import TARGETS

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_and_test_file_of_every_group_exists() -> None:
    missing = sorted(path for target in TARGETS.values()
                     for path in (*target.modules, *target.tests) if not (ROOT / path).is_file())
    assert missing == []
    assert all(target.tests for target in TARGETS.values())
