"""``publish`` refuses options that only mean something with another mode (exit 2, named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli import main


@pytest.mark.parametrize("option", [["--url", "http://127.0.0.1:1"], ["--token-file", "t"],
                                    ["--ca-file", "ca.pem"]])
def test_a_replica_option_without_wait_is_refused(option: list[str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    revision = tmp_path / "revision.toml"
    revision.write_text("schema_version = 1\n")
    assert main(["publish", str(revision), *option]) == 2
    assert "--url, --token-file and --ca-file go with --wait" in capsys.readouterr().err
    assert not (tmp_path / "var").exists()


def test_dry_run_with_wait_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    revision = tmp_path / "revision.toml"
    revision.write_text("schema_version = 1\n")
    assert main(["publish", str(revision), "--dry-run", "--wait"]) == 2
    assert "there is nothing to --wait for" in capsys.readouterr().err
