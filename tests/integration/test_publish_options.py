"""``publish`` refuses options that only mean something with another mode (exit 2, named)."""

from __future__ import annotations

import json
import os
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
    assert "--url, --token-file, --ca-file and --fleet go with --wait" in result.stderr
    assert not (tmp_path / "var").exists()


def test_dry_run_with_wait_is_refused(tmp_path: Path) -> None:
    revision = tmp_path / "revision.toml"
    revision.write_text("schema_version = 1\n")
    result = cli("publish", str(revision), "--dry-run", "--wait", check=False, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "there is nothing to --wait for" in result.stderr


#: The address space ``publish`` gets where it must not read its input whole: the
#: interpreter and its imports take about 80 MiB of it, a 54 MB file would not fit.
ADDRESS_SPACE = 120 * 1024 * 1024


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "supervisor.toml"
    config.write_text(f'[control_plane]\nurl = "sqlite:///{tmp_path}/cp.db"\n')
    return config


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_publish_refuses_what_is_not_a_regular_file_without_blocking(
        kind: str, tmp_path: Path) -> None:
    if kind == "device":
        target = "/dev/zero"
    elif kind == "fifo":
        target = str(tmp_path / "pipe")
        os.mkfifo(target)  # no writer: an open without O_NONBLOCK waits for one forever
    else:
        target = str(tmp_path)
    result = cli("publish", "--config", str(_config(tmp_path)), target, check=False,
                 timeout=30, address_space=ADDRESS_SPACE)
    assert result.returncode == 2, result.stderr
    assert f"{target}: " in result.stderr and "not a regular file" in result.stderr, result.stderr
    assert "nothing was stored" in result.stderr
    assert not (tmp_path / "cp.db").exists()


def test_publish_refuses_a_file_over_max_revision_bytes_before_reading_it(
        tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    with big.open("wb") as f:
        f.truncate(54_000_000)
    result = cli("publish", "--config", str(_config(tmp_path)), str(big), "--json",
                 check=False, timeout=30, address_space=ADDRESS_SPACE)
    assert result.returncode == 2, result.stderr
    assert "54000000 bytes, over max_revision_bytes (16777216)" in result.stderr
    assert json.loads(result.stdout) == {
        "ok": False, "reason": "denied", "file": str(big),
        "detail": f"{big}: 54000000 bytes, over max_revision_bytes (16777216); "
                  f"nothing was read"}
    assert not (tmp_path / "cp.db").exists()


def test_publish_dash_reads_standard_input(tmp_path: Path) -> None:
    result = cli("publish", "--config", str(_config(tmp_path)), "-",
                 stdin='schema_version = 1\n[aliases.db]\nupstream = "https://db.example:8443"\n')
    assert result.stdout.splitlines()[-1] == "1"
    shown = cli("show", "--config", str(_config(tmp_path)), "1", "--json")
    assert json.loads(shown.stdout)["document"]["aliases"]["db"]["upstream"] == \
        "https://db.example:8443"


def test_publish_dash_refuses_standard_input_past_the_bound(tmp_path: Path) -> None:
    with open("/dev/zero", "rb") as zeros:
        result = cli("publish", "--config", str(_config(tmp_path)), "-", check=False,
                     timeout=60, stdin=zeros, address_space=ADDRESS_SPACE)
    assert result.returncode == 2, result.stderr
    assert "standard input: more than 16777216 bytes (max_revision_bytes)" in result.stderr
    assert not (tmp_path / "cp.db").exists()


@pytest.mark.parametrize("kind", ["closed", "write-only"])
def test_publish_dash_without_a_readable_standard_input_is_a_usage_error(
        kind: str, tmp_path: Path) -> None:
    # Closed (`<&-`: Python has no sys.stdin) or open for writing only (EBADF on read).
    writable = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        result = cli("publish", "--config", str(_config(tmp_path)), "-", check=False,
                     timeout=30, close_stdin=kind == "closed",
                     stdin=writable if kind == "write-only" else None)
    finally:
        os.close(writable)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "standard input: " in result.stderr and "nothing was stored" in result.stderr
    assert not (tmp_path / "cp.db").exists()


def test_a_json_array_document_is_a_validation_refusal(tmp_path: Path) -> None:
    """An array is valid JSON of the wrong shape: the author's to fix, not damage."""
    document = tmp_path / "revision.json"
    document.write_text("[]")
    result = cli("publish", "--config", str(_config(tmp_path)), str(document), "--json",
                 check=False)
    assert result.returncode == 2, result.stderr
    assert f"refused: validation: {document}: $: " in result.stderr
    assert json.loads(result.stdout)["reason"] == "validation"


@pytest.mark.parametrize("command", [("publish", "FILE"), ("history",), ("rollback", "1"),
                                     ("db", "prune", "--keep", "1", "--yes")])
def test_a_lifecycle_command_on_a_follower_is_a_usage_error(
        command: tuple[str, ...], tmp_path: Path) -> None:
    """A follower has no control plane of its own: exit 2, as for any wrong usage."""
    revision = tmp_path / "revision.toml"
    revision.write_text("schema_version = 1\n")
    config = tmp_path / "follower.toml"
    config.write_text('[control_plane]\nurl = "http://127.0.0.1:1"\n'
                      'trusted_keys = ["ed25519:' + "A" * 43 + '="]\n')
    args = [str(revision) if word == "FILE" else word for word in command]
    result = cli(*args, "--config", str(config), "--json", check=False)
    assert result.returncode == 2, result.stderr
    assert "upstream" in result.stderr, result.stderr
    assert json.loads(result.stdout)["reason"] == "invalid"
