"""What a new adopter trips over first: missing files and directories, mistyped keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.proc import EXAMPLE, REPO, acli, write_config


async def test_publish_of_a_missing_file_says_no_such_file_not_corrupt(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    result = await acli("publish", "--config", str(config), str(tmp_path / "nope.toml"),
                        check=False)
    assert result.returncode == 2
    assert "nope.toml: No such file or directory" in result.stderr
    assert "corrupt" not in result.stderr and "nothing was stored" in result.stderr


async def test_a_missing_sqlite_directory_is_named(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/var/cp.db")
    for command in (("publish", "--config", str(config), str(EXAMPLE)),
                    ("db", "migrate", "--config", str(config)),
                    ("run", "--config", str(config))):
        result = await acli(*command, check=False)
        assert result.returncode == 2, (command, result.stderr)
        assert f"directory {tmp_path}/var" in result.stderr, result.stderr
        assert "$.control_plane.url" in result.stderr
        assert "unable to open database file" not in result.stderr


async def test_check_suggests_the_key_that_was_meant(tmp_path: Path) -> None:
    config = tmp_path / "typo.toml"
    config.write_text(f'[control_plane]\nurl = "sqlite:///{tmp_path}/cp.db"\n'
                      "poll_intervall_s = 2\n")
    result = await acli("check", "--config", str(config), check=False)
    assert result.returncode == 2
    assert "$.control_plane.poll_intervall_s: unknown key (did you mean `poll_interval_s`?)" \
        in result.stderr


async def test_the_readme_check_example_is_what_check_prints() -> None:
    """The README's ``check`` session on the shipped conf/prod.toml, line for line (on a host
    without /etc/trio-supervisor and /run/trio-supervisor, as the README's session was)."""
    if Path("/etc/trio-supervisor").exists() or Path("/run/trio-supervisor").exists():
        pytest.skip("this host has the production directories the example lacks")
    readme = (REPO / "README.rst").read_text()
    session = readme.split("    $ trio-supervisor check --config conf/prod.toml\n", 1)[1]
    quoted = [line.removeprefix("    ") for line in session.split("\n\n", 1)[0].splitlines()]
    result = await acli("check", "--config", "conf/prod.toml", check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == quoted
