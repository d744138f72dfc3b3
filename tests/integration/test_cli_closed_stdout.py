"""A reader that went away (``| head -0``, ``| head -1``) ends the command quietly
with exit 1: no traceback, no "unexpected error", no second document written
into the closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.proc import EXAMPLE, REPO, cli, write_config


def _into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=REPO,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
                              check=False)
    finally:
        os.close(write)


@pytest.mark.parametrize("command", [("history",), ("history", "--json"), ("show", "1"),
                                     ("show", "1", "--json"), ("completion", "bash")])
def test_a_closed_stdout_ends_the_command_quietly(tmp_path: Path,
                                                  command: tuple[str, ...]) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    cli("publish", "--config", str(config), str(EXAMPLE))
    words = command if command[0] == "completion" else (*command, "--config", str(config))
    result = _into_closed_pipe(*words)
    assert result.returncode == 1, result.stderr
    assert result.stderr == ""


def test_a_failure_document_into_a_closed_stdout_is_dropped_quietly(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/missing.db")
    result = _into_closed_pipe("history", "--json", "--config", str(config))
    assert result.returncode == 1
    assert "does not exist" in result.stderr  # the failure itself is still said
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
