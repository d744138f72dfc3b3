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


async def test_the_documented_check_example_is_what_check_prints() -> None:
    """The ``check`` session of docs/operations.md on the shipped conf/prod.toml, line for line
    (on a host without /etc/trio-supervisor and /run/trio-supervisor, as the session was)."""
    if Path("/etc/trio-supervisor").exists() or Path("/run/trio-supervisor").exists():
        pytest.skip("this host has the production directories the example lacks")
    page = (REPO / "docs" / "operations.md").read_text()
    session = page.split("    $ trio-supervisor check --config conf/prod.toml\n", 1)[1]
    quoted = [line.removeprefix("    ") for line in session.split("\n\n", 1)[0].splitlines()]
    result = await acli("check", "--config", "conf/prod.toml", check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == quoted


async def test_a_mistyped_subcommand_gets_the_one_that_was_meant() -> None:
    result = await acli("statu", check=False)
    assert result.returncode == 2
    assert "invalid choice: 'statu'" in result.stderr and "(did you mean `status`?)" \
        in result.stderr


async def test_keygen_takes_no_configuration(tmp_path: Path) -> None:
    result = await acli("keygen", "--config", "conf/dev.toml", "--out", str(tmp_path / "k"),
                        check=False)
    assert result.returncode == 2 and "unrecognized arguments: --config" in result.stderr
    assert not (tmp_path / "k").exists()


async def test_a_toml_syntax_error_is_validation_not_corrupt(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\n[aliases.chat\nupstream = "https://x/v1"\n')
    result = await acli("publish", "--config", str(config), str(bad), check=False)
    assert result.returncode == 2
    assert f"refused: validation: {bad}: $: not TOML:" in result.stderr, result.stderr


async def test_a_mistyped_revision_field_gets_the_one_that_was_meant(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    typo = tmp_path / "typo.toml"
    typo.write_text('schema_version = 1\n[aliases.chat]\nupstream = "https://x/v1"\n'
                    'timeout = 5\n')
    result = await acli("publish", "--config", str(config), str(typo), check=False)
    assert result.returncode == 2
    assert "$.aliases.chat: Object contains unknown field `timeout` (did you mean " \
        "`timeout_s`?)" in result.stderr, result.stderr


async def test_a_mistyped_dsn_parameter_is_named_not_blamed_on_the_password(
        tmp_path: Path) -> None:
    config = tmp_path / "dsn.toml"
    config.write_text('[control_plane]\nurl = "postgresql://u:secret@127.0.0.1/db'
                      '?sslmod=require"\n')
    result = await acli("check", "--config", str(config), check=False)
    assert result.returncode == 2
    assert "unknown connection parameter `sslmod` (did you mean `sslmode`?)" in result.stderr
    assert "percent-encode" not in result.stderr and "secret" not in result.stderr
