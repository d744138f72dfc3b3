"""``trio-supervisor completion bash|zsh``: generated from the parser, and bash completes
with it (the real bash, sourcing what the real console script prints)."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli import _parser

SCRIPT = str(Path(sys.executable).parent / "trio-supervisor")


def _completions(*words: str, env: dict[str, str] | None = None) -> list[str]:
    line = " ".join(shlex.quote(w) for w in words)
    program = (f'source <("{SCRIPT}" completion bash)\n'
               f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
               '_trio_supervisor; printf "%s\\n" "${COMPREPLY[@]}"\n')
    # Two interpreter starts (the script, then the revision ids): 90 s on a loaded machine.
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True,
                            timeout=90, check=False, env=env)
    assert result.returncode == 0, result.stderr
    assert env is None or result.stderr == "", result.stderr
    return result.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_subcommands_options_and_choices() -> None:
    assert _completions("trio-supervisor", "sta") == ["status"]
    assert _completions("trio-supervisor", "publish", "--fo") == ["--force"]
    assert sorted(_completions("trio-supervisor", "status", "--c")) == ["--ca-file", "--check", "--config"]
    assert _completions("trio-supervisor", "db", "m") == ["migrate"]
    assert sorted(_completions("trio-supervisor", "completion", "")) == [
        "--help", "--revision-ids", "bash", "zsh"]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_every_subcommand_and_option_of_the_parser_is_in_the_script(shell: str) -> None:
    result = subprocess.run([SCRIPT, "completion", shell], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    parser = _parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        assert f"({name})" in result.stdout or f"{name})" in result.stdout, name
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--"):
                    assert option in result.stdout, (name, option)
    if shutil.which(shell):
        syntax = subprocess.run([shell, "-n"], input=result.stdout, capture_output=True,
                                text=True, timeout=30, check=False)
        assert syntax.returncode == 0, syntax.stderr


def test_an_unknown_shell_is_exit_2() -> None:
    result = subprocess.run([SCRIPT, "completion", "fish"], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 2 and "invalid choice: 'fish'" in result.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_revision_ids_from_the_configured_store(tmp_path: Path) -> None:
    from tests.proc import EXAMPLE, REPO, cli, write_config

    config = str(write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db"))
    for _ in range(3):
        cli("publish", "--config", config, str(EXAMPLE), "--force")
    env = {"PYTHONPATH": str(REPO), "PATH": f"{Path(SCRIPT).parent}:/usr/bin:/bin"}
    for command in ("show", "rollback", "diff"):
        offered = _completions("trio-supervisor", "--config", config, command, "", env=env)
        assert offered == ["3", "2", "1"], command
    assert _completions("trio-supervisor", "--config", config, "show", "2", env=env) == ["2"]
    # A store that cannot be read offers no ids, and says nothing.
    gone = _completions("trio-supervisor", "--config", str(tmp_path / "none.toml"), "show", "",
                        env=env)
    assert gone == ["--help", "--config", "--json"]  # the options, as before
