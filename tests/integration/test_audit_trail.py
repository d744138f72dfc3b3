"""Who changed desired, when and why: ``history`` shows every publish and rollback from
``supervisor_desired_log``; a publish of the desired body stores nothing unless ``--force``."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest

from tests.proc import EXAMPLE, acli, write_config


@pytest.fixture(params=["postgresql", "sqlite"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_url" if request.param == "postgresql"
                                       else "sqlite_url"))


def _other(tmp_path: Path) -> Path:
    other = tmp_path / "other.toml"
    other.write_text(EXAMPLE.read_text().replace("timeout_s = 5", "timeout_s = 9"))
    return other


async def test_history_shows_who_changed_desired_and_why(url: str, tmp_path: Path) -> None:
    config = str(write_config(tmp_path, url))
    await acli("db", "migrate", "--config", config)
    first = await acli("publish", "--config", config, str(EXAMPLE), "--message", "first")
    assert first.stdout.splitlines()[0].endswith(", sequence 1"), first.stdout
    await acli("publish", "--config", config, str(_other(tmp_path)), "--message", "slower")
    rolled = await acli("rollback", "1", "--config", config, "--message", "too slow")
    assert rolled.stdout.splitlines() == ["desired revision 2 -> 1 (sequence 3): too slow", "1"]

    doc = json.loads((await acli("history", "--config", config, "--json")).stdout)
    changes = doc["changes"]
    assert [(c["sequence"], c["revision_id"], c["message"]) for c in changes] == [
        (3, 1, "too slow"), (2, 2, "slower"), (1, 1, "first")]
    assert all(set(c) == {"sequence", "revision_id", "changed_at", "changed_by", "message"}
               for c in changes)
    assert all(c["changed_at"].endswith("Z") for c in changes)
    who = "postgres@" if url.startswith("postgresql") else getpass.getuser()
    assert all(c["changed_by"].startswith(who) for c in changes), changes

    text = (await acli("history", "--config", config)).stdout
    section = text.split("changes of desired, newest first:\n", 1)[1].splitlines()
    assert section[0].split() == ["SEQ", "CHANGE", "AT", "BY", "MESSAGE"]
    assert section[1].split()[:4] == ["3", "2", "->", "1"] and "(rollback)" in section[1]
    assert section[1].endswith("too slow") and section[3].split()[:4] == ["1", "-", "->", "1"]

    limited = json.loads((await acli("history", "--config", config, "--json", "--limit", "1")
                          ).stdout)
    assert [c["sequence"] for c in limited["changes"]] == [3]


async def test_publishing_the_desired_body_again_stores_nothing_unless_forced(
        url: str, tmp_path: Path) -> None:
    config = str(write_config(tmp_path, url))
    await acli("db", "migrate", "--config", config)
    await acli("publish", "--config", config, str(EXAMPLE))
    again = await acli("publish", "--config", config, str(EXAMPLE), "--json")
    doc = json.loads(again.stdout)
    assert doc["ok"] is True and doc["unchanged"] is True
    assert (doc["revision"], doc["sequence"]) == (1, 1)
    text = await acli("publish", "--config", config, str(EXAMPLE))
    assert "desired already with this body" in text.stdout
    assert "nothing was stored" in text.stdout and text.stdout.splitlines()[-1] == "1"
    history = json.loads((await acli("history", "--config", config, "--json")).stdout)
    assert [r["id"] for r in history["revisions"]] == [1]
    assert len(history["changes"]) == 1

    forced = json.loads((await acli("publish", "--config", config, str(EXAMPLE), "--force",
                                    "--json")).stdout)
    assert forced["unchanged"] is False and (forced["revision"], forced["sequence"]) == (2, 2)


async def test_publish_names_the_store_it_wrote_and_a_new_one_it_made(tmp_path: Path) -> None:
    """The embedded default's relative SQLite path, run from another directory, makes a
    control plane the daemon never reads: publish says where it wrote, and that it was new."""
    config = tmp_path / "default.toml"
    config.write_text('[log]\nlevel = "info"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = await acli("publish", "--config", str(config), str(EXAMPLE), cwd=elsewhere)
    store = elsewhere / "var" / "controlplane.db"
    assert store.exists()
    assert f"published revision 1 to {store}" in result.stdout
    assert f"created a new control plane {store}" in result.stderr
    assert f"relative to the working directory {elsewhere}" in result.stderr
    again = await acli("publish", "--config", str(config), str(_other(tmp_path)), cwd=elsewhere)
    assert "created a new control plane" not in again.stderr
    assert f"published revision 2 to {store}" in again.stdout


async def test_rollback_without_the_replicas_token_says_it_did_not_ask(tmp_path: Path) -> None:
    """The replica's token file is often readable by its own user only: the operator can
    still roll back, and is told that no replica's refusal was checked."""
    config = str(write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                              f'token_file = "{tmp_path}/no-such.token"'))
    await acli("publish", "--config", config, str(EXAMPLE))
    await acli("publish", "--config", config, str(_other(tmp_path)))
    rolled = await acli("rollback", "1", "--config", config, "--message", "back", check=False)
    assert rolled.returncode == 0, rolled.stderr
    assert "warning: cannot check the replica's last refusal" in rolled.stderr
    named = await acli("rollback", "2", "--config", config, "--token-file",
                       str(tmp_path / "no-such.token"), check=False)
    assert named.returncode == 2 and "--token-file" in named.stderr


async def test_rollback_with_no_replica_listening_where_the_config_points_says_nothing(
        tmp_path: Path) -> None:
    """Nothing listening at the configuration's admin address is the usual case on an
    operator's machine: the rollback is done without a warning; named with --url, the
    same address is warned about."""
    config = str(write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db"))
    await acli("publish", "--config", config, str(EXAMPLE))
    await acli("publish", "--config", config, str(_other(tmp_path)))
    quiet = await acli("rollback", "1", "--config", config, check=False)
    assert quiet.returncode == 0, quiet.stderr
    assert "warning" not in quiet.stderr, quiet.stderr
    named = await acli("rollback", "2", "--config", config, "--url", "http://127.0.0.1:1",
                       check=False)
    assert named.returncode == 0, named.stderr
    assert "warning: cannot check the replica's last refusal" in named.stderr
