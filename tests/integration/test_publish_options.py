"""``publish`` refuses options that only mean something with another mode (exit 2, named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.proc import cli


@pytest.mark.parametrize("option", [["--url", "http://127.0.0.1:1"], ["--token-file", "t"],
                                    ["--ca-file", "ca.pem"]])
def test_a_replica_option_without_wait_is_refused(option: list[str], tmp_path: Path) -> None:
    revision = tmp_path / "revision.toml"
    revision.write_text("schema_version = 1\n")
    result = cli("publish", str(revision), *option, check=False, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "--url, --token-file and --ca-file go with --wait" in result.stderr
    assert not (tmp_path / "var").exists()


def test_dry_run_with_wait_is_refused(tmp_path: Path) -> None:
    revision = tmp_path / "revision.toml"
    revision.write_text("schema_version = 1\n")
    result = cli("publish", str(revision), "--dry-run", "--wait", check=False, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "there is nothing to --wait for" in result.stderr
