"""The revision lifecycle through the console script, on PostgreSQL and on SQLite.

history, show, diff, rollback, db prune, publish --dry-run and --resolve-secrets:
their tables, their --json documents and their error exits. What the daemon
makes of a rollback or a --wait is in ``test_lifecycle_process.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import trio

from supervisor.revision.compile import compile_revision
from supervisor.revision.errors import RevisionError
from supervisor.revision.files import load_document_file
from supervisor.revision.secrets import EnvFileResolver
from tests.proc import EXAMPLE, REPO, write_config

SCRIPT = str(Path(sys.executable).parent / "trio-supervisor")
UNSET = "TRIO_SUP_LIFECYCLE_UNSET"


async def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, not ``python -m``: what operators type."""
    full_env = {**os.environ, **(env or {})}
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, check=False, cwd=str(REPO),
        env=full_env, timeout=60,
    ))


async def run_all(*commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Independent read-only commands at once (each is a process start on a busy machine)."""
    results: list[subprocess.CompletedProcess[str] | None] = [None] * len(commands)

    async def one(i: int) -> None:
        results[i] = await run(*commands[i])

    async with trio.open_nursery() as nursery:
        for i in range(len(commands)):
            nursery.start_soon(one, i)
    return [r for r in results if r is not None]


def out(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout


def err(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr


@pytest.fixture(params=["postgresql", "sqlite"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_url" if request.param == "postgresql"
                                       else "sqlite_url"))


def _raw_insert(url: str, schema_version: int, body: bytes) -> None:
    """A revision stored by plain SQL (docs/control-plane.md), as another tool might."""
    params = (schema_version, body, hashlib.sha256(body).digest())
    statement = ("INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                 " VALUES (%s, %s, %s)")
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(statement.replace("%s", "?"), params)
    else:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statement, params)


def _second(tmp_path: Path) -> Path:
    second = tmp_path / "second.toml"
    second.write_text(
        EXAMPLE.read_text().replace("timeout_s = 5", "timeout_s = 10")
        + '\n[aliases.search]\nupstream = "https://search.internal/v1"\n'
        + f'\n[keys.team-b]\nsecret = "env:{UNSET}"\naliases = ["search"]\n'
    )
    return second


async def test_history_show_diff_rollback_prune(url: str, tmp_path: Path) -> None:
    config = str(write_config(tmp_path, url))
    if url.startswith("postgresql"):
        assert (await run("db", "migrate", "--config", config)).returncode == 0
    first = await run("publish", "--config", config, str(EXAMPLE), "--message", "first")
    assert out(first).splitlines()[-1] == "1"
    second = await run("publish", "--config", config, str(_second(tmp_path)),
                       "--message", "add search")
    assert second.returncode == 0 and out(second).splitlines()[-1] == "2"

    history, limited, shown, shown_one, diff, backwards = await run_all(
        ("history", "--config", config),
        ("history", "--config", config, "--json", "--limit", "1"),
        ("show", "2", "--config", config),
        ("show", "1", "--config", config, "--json"),
        ("diff", "1", "--config", config),
        ("diff", "2", "1", "--config", config, "--json"),
    )
    assert history.returncode == 0
    lines = out(history).splitlines()
    assert lines[0].split() == ["ID", "CREATED", "SCHEMA", "SIZE", "SHA256", "MESSAGE"]
    assert lines[1].startswith("*") and lines[1].split()[1] == "2"
    assert lines[1].endswith("add search") and lines[2].split()[0] == "1"
    assert lines[3] == "* desired: revision 2" and lines[5] == "changes of desired, newest first:"
    doc = json.loads(out(limited))
    assert doc["desired"] == 2 and [r["id"] for r in doc["revisions"]] == [2]
    row = doc["revisions"][0]
    _, body = load_document_file(_second(tmp_path))
    assert row["body_sha256"] == hashlib.sha256(body).hexdigest()  # all 64 hex digits
    assert row["size"] == len(body) and row["desired"] is True and row["schema_version"] == 1
    assert row["created_at"].endswith("Z") and row["message"] == "add search"

    assert shown.returncode == 0
    text = out(shown)
    assert "# revision 2 (desired)" in text and "# message: add search" in text
    assert f'secret = "env:{UNSET}"' in text  # the reference, never resolved
    # What show prints is a document publish accepts, and it is the same document.
    copy = tmp_path / "copy.toml"
    copy.write_text(text)
    assert load_document_file(copy) == load_document_file(_second(tmp_path))
    shown_json = json.loads(out(shown_one))
    assert shown_json["desired"] is False and shown_json["message"] == "first"
    assert shown_json["document"]["keys"]["example"]["secret"] == "file:conf/example.key"

    assert diff.returncode == 1  # they differ, as diff(1) says it
    assert out(diff).splitlines() == [
        "revision 1 -> revision 2: 3 change(s)",
        "  ~ $.aliases.embeddings.timeout_s: 5.0 -> 10.0",
        '  + $.aliases.search: {"upstream": "https://search.internal/v1", "timeout_s": 30.0, '
        '"retries": 2}',
        f'  + $.keys.team-b: {{"secret": "env:{UNSET}", "aliases": ["search"]}}',
    ]
    diff_json = json.loads(out(backwards))
    assert diff_json["from"] == 2 and diff_json["to"] == 1
    assert {c["op"] for c in diff_json["changes"]} == {"changed", "removed"}

    rolled = await run("rollback", "1", "--config", config, "--message", "search broke")
    assert rolled.returncode == 0, err(rolled)
    assert out(rolled).splitlines() == ["desired revision 2 -> 1 (sequence 3): search broke",
                                         "1"]
    assert json.loads(out(await run("history", "--config", config, "--json")))["desired"] == 1

    for i in range(3):
        await run("publish", "--config", config, str(EXAMPLE), "--message", f"again {i}",
                  "--force")
    await run("rollback", "2", "--config", config)
    pruned = await run("db", "prune", "--keep", "2", "--yes", "--config", config)
    assert pruned.returncode == 0
    assert out(pruned).splitlines() == ["deleted 2 revision(s): 1, 3",
                                        "kept the newest 2 and the desired one (2)"]
    again = json.loads(out(await run("db", "prune", "--keep", "2", "--yes", "--config", config,
                                     "--json")))
    assert again == {"deleted": [], "keep": 2, "desired": 2}
    left = json.loads(out(await run("history", "--config", config, "--json")))
    assert [r["id"] for r in left["revisions"]] == [5, 4, 2]


async def test_error_exits(url: str, tmp_path: Path) -> None:
    config = str(write_config(tmp_path, url))
    await run("db", "migrate", "--config", config)
    await run("publish", "--config", config, str(EXAMPLE))
    missing = (("show", "9"), ("rollback", "9"), ("diff", "9"), ("diff", "1", "9"))
    for command, result in zip(missing, await run_all(*((*c, "--config", config)
                                                        for c in missing)), strict=True):
        assert result.returncode == (2 if command[0] == "diff" else 1), command
        assert "revision 9 does not exist" in err(result)
    # Unreadable: a newer schema, a body that does not validate, one the daemon would refuse.
    _raw_insert(url, 2, b'{"schema_version": 2, "routes": {}}')
    _raw_insert(url, 1, b'{"schema_version": 1, "aliases": {"a": {"upstream": "gopher://x"}}}')
    _raw_insert(url, 1, b'{"schema_version": 1, "keys": {"k": {"secret": "env:X",'
                        b' "aliases": ["nope"]}}}')
    unreadable = (("2", "incompatible", "schema_version 2"),
                  ("3", "validation", "$.aliases.a.upstream"),
                  ("4", "projection", "$.keys.k"))
    results = await run_all(*(("rollback", rev, "--config", config) for rev, _, _ in unreadable),
                            ("diff", "1", "2", "--config", config),
                            ("show", "2", "--config", config),
                            ("history", "--config", config, "--json"))
    for (rev, reason, where), result in zip(unreadable, results, strict=False):
        assert result.returncode == 2, (rev, err(result))
        assert f"({reason})" in err(result) and where in err(result)
        assert "desired was not changed" in err(result)
    diff, shown, history = results[3:]
    assert diff.returncode == 2 and "(incompatible)" in err(diff)
    # show prints what this build cannot read as stored, saying why.
    assert shown.returncode == 0 and "cannot read it (incompatible)" in out(shown)
    assert '"routes": {}' in out(shown)
    assert json.loads(out(history))["desired"] == 1
    bad_usage = (("show", "0"), ("show", "x"), ("db", "prune"), ("db", "prune", "--keep", "-1"),
                 ("history", "--limit", "x"), ("db", "migrate", "--keep", "3"))
    for command, result in zip(bad_usage, await run_all(*((*c, "--config", config)
                                                          for c in bad_usage)), strict=True):
        assert result.returncode == 2, command


async def test_dry_run_refuses_as_the_daemon_would(url: str, tmp_path: Path) -> None:
    config = str(write_config(tmp_path, url))
    await run("db", "migrate", "--config", config)
    await run("publish", "--config", config, str(EXAMPLE))
    second = _second(tmp_path)
    dry = ("publish", "--config", config, str(second), "--dry-run")
    refused, as_json = await run_all(dry, (*dry, "--json"))
    assert refused.returncode == 2
    last = err(refused).strip().splitlines()[-1]
    # The daemon's own verdict on this body in this environment, by the same code path.
    _, body = load_document_file(second)
    with pytest.raises(RevisionError) as daemon:
        compile_revision(body, revision=2, generation=1, resolver=EnvFileResolver())
    assert last.startswith(f"refused: {daemon.value.reason}: ")
    assert daemon.value.detail in last and "$.keys.team-b.secret" in last
    assert json.loads(out(as_json)) == {"ok": False, "reason": "secret",
                                        "detail": daemon.value.detail, "file": str(second)}

    ok = await run("publish", "--config", config, str(second), "--dry-run",
                   env={UNSET: "team-b-secret"})
    assert ok.returncode == 0, err(ok)
    assert out(ok).splitlines()[1] == "changes against desired revision 1 (3):"
    assert "team-b-secret" not in out(ok)
    changes = json.loads(out(await run("publish", "--config", config, str(second),
                                       "--dry-run", "--json", env={UNSET: "v"})))
    assert changes["ok"] is True and changes["desired"] == 1 and len(changes["changes"]) == 3
    # Nothing was stored by any of it.
    assert json.loads(out(await run("history", "--config", config, "--json")))["desired"] == 1
    assert len(json.loads(out(await run("history", "--config", config,
                                        "--json")))["revisions"]) == 1

    invalid = tmp_path / "invalid.toml"
    invalid.write_text('schema_version = 1\n[aliases.a]\nupstream = "gopher://a"\n')
    result = await run("publish", "--config", config, str(invalid), "--dry-run")
    assert result.returncode == 2
    assert err(result).strip().splitlines()[-1].startswith("refused: validation: ")
    assert "$.aliases.a.upstream" in err(result)


async def test_resolve_secrets_refuses_what_no_replica_could_serve(
    url: str, tmp_path: Path
) -> None:
    config = str(write_config(tmp_path, url))
    await run("db", "migrate", "--config", config)
    second = str(_second(tmp_path))
    refused = await run("publish", "--config", config, second, "--resolve-secrets")
    assert refused.returncode == 2
    assert f"refused: secret: {second}: $.keys.team-b.secret: environment variable {UNSET} " \
           "is not set or empty; nothing was stored" == err(refused).strip().splitlines()[-1]
    # Without the switch, the same file is stored: secrets may live only on the replicas.
    assert (await run("publish", "--config", config, second)).returncode == 0
    stored = await run("publish", "--config", config, second, "--resolve-secrets", "--force",
                       env={UNSET: "here"})
    assert stored.returncode == 0 and out(stored).splitlines()[-1] == "2"


def _shape(doc: object) -> object:
    """The keys and JSON types of a document (lists by their first item): what scripts rely on."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shape(doc[0])] if doc else []
    return type(doc).__name__


async def test_every_json_document_keeps_its_keys_and_types(url: str, tmp_path: Path) -> None:
    """Every lifecycle command answers --json, and scripts can rely on its keys and types."""
    config = str(write_config(tmp_path, url))
    await run("db", "migrate", "--config", config)
    empty = json.loads(out(await run("history", "--config", config, "--json")))
    assert empty == {"desired": None, "revisions": [], "changes": []}
    published = await run("publish", "--config", config, str(EXAMPLE), "--message", "one",
                          "--json")
    assert published.returncode == 0, err(published)
    assert _shape(json.loads(out(published))) == {"ok": "bool", "revision": "int",
                                                  "sequence": "int", "unchanged": "bool",
                                                  "store": "str"}
    await run("publish", "--config", config, str(_second(tmp_path)), "--message", "two")
    refused = await run("publish", "--config", config, str(_second(tmp_path)),
                        "--resolve-secrets", "--json")
    assert refused.returncode == 2
    assert _shape(json.loads(out(refused))) == {"ok": "bool", "reason": "str", "detail": "str",
                                                "file": "str"}  # the file it names
    history, shown, diff, dry = await run_all(
        ("history", "--config", config, "--json"),
        ("show", "1", "--config", config, "--json"),
        ("diff", "1", "2", "--config", config, "--json"),
        ("publish", "--config", config, str(EXAMPLE), "--dry-run", "--json"),
    )
    revision = {"id": "int", "created_at": "str", "message": "str", "schema_version": "int",
                "size": "int", "body_sha256": "str", "desired": "bool"}
    change_record = {"sequence": "int", "revision_id": "int", "changed_at": "str",
                     "changed_by": "str", "message": "str"}
    assert _shape(json.loads(out(history))) == {"desired": "int", "revisions": [revision],
                                                "changes": [change_record]}
    shown_doc = json.loads(out(shown))
    assert _shape({k: v for k, v in shown_doc.items() if k != "document"}) == revision
    assert isinstance(shown_doc["document"], dict)
    change = {"op": "str", "path": "str", "from": "float", "to": "float"}
    assert _shape(json.loads(out(diff))) == {"from": "int", "to": "int", "changes": [change]}
    assert _shape(json.loads(out(dry))) == {"ok": "bool", "desired": "int",
                                            "changes": [change]}
    rolled = await run("rollback", "1", "--config", config, "--message", "why", "--json")
    assert rolled.returncode == 0, err(rolled)
    assert json.loads(out(rolled)) == {"revision": 1, "previous": 2, "sequence": 3,
                                       "message": "why"}
    pruned = json.loads(out(await run("db", "prune", "--keep", "0", "--yes", "--config", config,
                                      "--json")))
    assert pruned == {"deleted": [2], "keep": 0, "desired": 1}


async def test_dry_run_and_resolve_secrets_apply_the_daemons_bounds(tmp_path: Path) -> None:
    """``[revision]`` confinement and ``max_revision_bytes`` are the daemon's refusals too: a
    dry run that says "compiles" for them, or a publish that stores past them, would be a
    revision every replica refuses."""
    from supervisor.config import RevisionConfig

    config = tmp_path / "supervisor.toml"
    config.write_text(f'[control_plane]\nurl = "sqlite:///{tmp_path}/cp.db"\n'
                      'max_revision_bytes = 1024\n'
                      '[revision]\nsecret_env_prefixes = ["TEAM_"]\n')
    # A dry run before the first publish: against nothing, and still nothing is created.
    first = await run("publish", "--config", str(config), str(EXAMPLE), "--dry-run")
    assert first.returncode == 0, err(first)
    assert out(first).splitlines()[1] == "changes against nothing (3):"
    assert not (tmp_path / "cp.db").exists()
    assert (await run("publish", "--config", str(config), str(EXAMPLE))).returncode == 0
    home = tmp_path / "home.toml"
    home.write_text('schema_version = 1\n[aliases.chat]\nupstream = "https://x/v1"\n'
                    '[keys.k]\nsecret = "env:HOME"\naliases = ["chat"]\n')
    _, body = load_document_file(home)
    with pytest.raises(RevisionError) as daemon:  # what a replica with this config does
        compile_revision(body, revision=2, generation=1, resolver=EnvFileResolver.from_config(
            RevisionConfig(secret_env_prefixes=("TEAM_",))))
    large = tmp_path / "large.toml"
    large.write_text("schema_version = 1\n" + "".join(
        f'[aliases.a{i}]\nupstream = "https://u{i}.internal/v1"\n' for i in range(40)))
    _raw_insert(f"sqlite:///{tmp_path}/cp.db", 1, body)  # revision 2, by plain SQL
    dry_home, resolved_home, stored_home, dry_large, stored_large = await run_all(
        ("publish", "--config", str(config), str(home), "--dry-run"),
        ("publish", "--config", str(config), str(home), "--resolve-secrets"),
        # Where a reference may point does not depend on the secret: plain publish knows.
        ("publish", "--config", str(config), str(home)),
        ("publish", "--config", str(config), str(large), "--dry-run"),
        ("publish", "--config", str(config), str(large)),
    )
    for result in (dry_home, resolved_home, stored_home):
        assert result.returncode == 2, out(result) + err(result)
        assert err(result).strip().splitlines()[-1] == (
            f"refused: secret: {home}: {daemon.value.detail}; nothing was stored")
    rolled = await run("rollback", "2", "--config", str(config))
    assert rolled.returncode == 2 and "(secret)" in err(rolled), err(rolled)
    assert daemon.value.detail in err(rolled) and "desired was not changed" in err(rolled)
    for result in (dry_large, stored_large):
        assert result.returncode == 2, out(result) + err(result)
        last = err(result).strip().splitlines()[-1]
        assert last.startswith(f"refused: denied: {large}: ") and "max_revision_bytes (1024)" \
            in last and last.endswith("; nothing was stored"), last
    history = json.loads(out(await run("history", "--config", str(config), "--json")))
    assert [r["id"] for r in history["revisions"]] == [2, 1] and history["desired"] == 1


async def test_a_stored_message_cannot_drive_the_operators_terminal(tmp_path: Path) -> None:
    """Whoever can publish (plain SQL included) writes the message; ``show`` and ``history``
    print it to an operator's terminal, so control characters (ANSI escapes) never pass."""
    config = str(write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db"))
    hostile = "fine\x1b]0;pwned\x07\x1b[2J\rhidden"
    assert (await run("publish", "--config", config, str(EXAMPLE), "--message",
                      hostile)).returncode == 0
    shown, history = await run_all(("show", "1", "--config", config),
                                   ("history", "--config", config))
    for result in (shown, history):
        assert result.returncode == 0, err(result)
        assert not [c for c in out(result) if not c.isprintable() and c != "\n"], out(result)
        assert "fine" in out(result) and "hidden" in out(result)
    # --json keeps the message exactly as stored (escaped by JSON).
    doc = json.loads(out(await run("show", "1", "--config", config, "--json")))
    assert doc["message"] == hostile


async def test_show_of_an_unreadable_body_cannot_drive_the_operators_terminal(
        tmp_path: Path) -> None:
    """A body this build cannot read is shown as stored, so plain SQL can put anything
    there: its control characters (ANSI escapes, BEL) never reach the terminal."""
    url = f"sqlite:///{tmp_path}/cp.db"
    config = str(write_config(tmp_path, url))
    assert (await run("publish", "--config", config, str(EXAMPLE))).returncode == 0
    _raw_insert(url, 1, b"not json \x1b[2J\x1b]0;pwned\x07 tail\nline two")  # revision 2
    _raw_insert(url, 9, b'{"schema_version": 9, "x": "\x1b[31mred"}')  # 3: raw ESC in JSON
    for revision in ("2", "3"):
        shown = await run("show", revision, "--config", config)
        assert shown.returncode == 0, err(shown)
        assert "this build cannot read it" in out(shown)
        assert not [c for c in out(shown) if not c.isprintable() and c != "\n"], out(shown)
    assert "tail" in out(await run("show", "2", "--config", config))


async def test_rollback_and_diff_refuse_a_damaged_or_oversized_revision_as_unreadable(
    tmp_path: Path,
) -> None:
    """A body that no longer matches its digest (``corrupt``) or is over this replica's
    ``max_revision_bytes`` (``denied``) cannot be read by this build: exit 2 with the label,
    as for an incompatible one, not 1 (which says it does not exist, or try again)."""
    db = tmp_path / "cp.db"
    config = tmp_path / "supervisor.toml"
    config.write_text(f'[control_plane]\nurl = "sqlite:///{db}"\nmax_revision_bytes = 1024\n')
    assert (await run("publish", "--config", str(config), str(EXAMPLE))).returncode == 0
    large = json.dumps({"schema_version": 1, "aliases": {
        f"a{i}": {"upstream": f"https://u{i}.internal/v1"} for i in range(40)}}).encode()
    damaged = b'{"schema_version": 1}'
    with sqlite3.connect(db) as conn:
        insert = ("INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                  " VALUES (1, ?, ?)")
        conn.execute(insert, (large, hashlib.sha256(large).digest()))  # revision 2
        conn.execute(insert, (damaged, hashlib.sha256(b"other").digest()))  # revision 3
    results = await run_all(*((command, rev, *more, "--config", str(config))
                              for rev in ("2", "3")
                              for command, *more in (("rollback",), ("diff", "1"))))
    labels = ["denied", "denied", "corrupt", "corrupt"]
    for label, result in zip(labels, results, strict=True):
        assert result.returncode == 2, err(result)
        assert f"({label})" in err(result) and "cannot be read by this build" in err(result)
    assert "desired was not changed" in err(results[0]) + err(results[2])
    history = json.loads(out(await run("history", "--config", str(config), "--json")))
    assert history["desired"] == 1


async def test_a_missing_sqlite_file_says_what_creates_it(tmp_path: Path) -> None:
    """history before any publish: exit 1, the path named, and the commands that create it."""
    with trio.fail_after(60):
        db = tmp_path / "nowhere.db"
        config = str(write_config(tmp_path, f"sqlite:///{db}"))
        result = await run("history", "--config", config)
        assert result.returncode == 1, result
        assert f"the control-plane file {db} does not exist" in err(result)
        assert "db migrate" in err(result) and "publish FILE" in err(result)
        assert not db.exists()  # a read never creates the file


async def _three(config: str, tmp_path: Path) -> None:
    """Revisions 1 (EXAMPLE), 2 (another body) and 3 (EXAMPLE again), 3 desired."""
    for args in ((str(EXAMPLE),), (str(_second(tmp_path)),), (str(EXAMPLE), "--force")):
        assert (await run("publish", "--config", config, *args)).returncode == 0


async def test_diff_exits_1_on_differences_0_on_none_2_on_trouble(
        sqlite_url: str, tmp_path: Path) -> None:
    """diff(1) and kubectl diff: a pipeline can tell "differs" from "failed"."""
    with trio.fail_after(180):
        config = str(write_config(tmp_path, sqlite_url))
        await _three(config, tmp_path)
        differ, same, missing, as_json = await run_all(
            ("diff", "1", "2", "--config", config), ("diff", "1", "3", "--config", config),
            ("diff", "1", "9", "--config", config), ("diff", "1", "2", "--config", config,
                                                     "--json"))
    assert differ.returncode == 1 and "3 change(s)" in out(differ), err(differ)
    assert same.returncode == 0 and "0 change(s)" in out(same), err(same)
    assert missing.returncode == 2 and "revision 9 does not exist" in err(missing)
    assert as_json.returncode == 1 and len(json.loads(out(as_json))["changes"]) == 3


def _pty_answer(args: list[str], answer: bytes) -> subprocess.CompletedProcess[str]:
    """``args`` with a terminal on standard input that has ``answer`` typed into it."""
    import pty

    leader, follower = pty.openpty()
    try:
        os.write(leader, answer)
        return subprocess.run([SCRIPT, *args], stdin=follower, capture_output=True, text=True,
                              check=False, cwd=str(REPO), timeout=60)
    finally:
        os.close(follower)
        os.close(leader)


async def test_rollback_and_prune_dry_run_and_prune_asks_before_deleting(
        sqlite_url: str, tmp_path: Path) -> None:
    with trio.fail_after(240):
        config = str(write_config(tmp_path, sqlite_url))
        await _three(config, tmp_path)
        before = out(await run("history", "--config", config, "--json"))
        rolled, pruned, pruned_json, refused, all_refused = await run_all(
            ("rollback", "1", "--dry-run", "--config", config),
            ("db", "prune", "--keep", "1", "--dry-run", "--config", config),
            ("db", "prune", "--keep", "1", "--dry-run", "--json", "--config", config),
            ("db", "prune", "--keep", "1", "--config", config),
            ("db", "prune", "--keep", "0", "--config", config))
        assert rolled.returncode == 0, err(rolled)
        assert out(rolled).splitlines() == [
            "would point desired revision 3 -> 1; nothing was changed (--dry-run)"]
        already = await run("rollback", "3", "--config", config)
        assert already.returncode == 0, err(already)
        assert out(already).splitlines() == [
            "revision 3 is already desired (sequence 3); nothing was changed"]
        assert pruned.returncode == 0, err(pruned)
        assert out(pruned).splitlines()[0] == \
            "would delete 2 revision(s): 1-2; nothing was deleted (--dry-run)"
        assert json.loads(out(pruned_json)) == {"deleted": [1, 2], "keep": 1, "desired": 3,
                                                "dry_run": True}
        for result in (refused, all_refused):
            assert result.returncode == 2, err(result)
            assert "would delete" in err(result) and "--yes" in err(result)
        assert out(await run("history", "--config", config, "--json")) == before
        declined = await trio.to_thread.run_sync(
            _pty_answer, ["db", "prune", "--keep", "1", "--config", config], b"n\n")
        assert declined.returncode == 1, err(declined)
        assert "delete 2 revision(s): 1-2? [y/N]" in err(declined)
        assert out(await run("history", "--config", config, "--json")) == before
        agreed = await trio.to_thread.run_sync(
            _pty_answer, ["db", "prune", "--keep", "1", "--config", config], b"y\n")
        assert agreed.returncode == 0, err(agreed)
        assert out(agreed).splitlines()[0] == "deleted 2 revision(s): 1-2"
        again = await run("db", "prune", "--keep", "1", "--config", config)
        assert again.returncode == 0 and out(again).startswith("nothing to delete")
