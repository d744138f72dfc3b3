"""Compiling a revision: stages and their reasons, secrets, and the snapshot's guarantees."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor import reasons
from supervisor.revision import (
    AliasSpec,
    EnvFileResolver,
    KeyEntry,
    RevisionError,
    Snapshot,
    compile_revision,
)
from supervisor.revision.secrets import MAX_SECRET_BYTES

SECRET_A = "sk-team-a-5b0d7e4f"
SECRET_B = "sk-team-b-a91c33d2"
ENV = {"TEAM_A_KEY": SECRET_A, "TEAM_B_KEY": SECRET_B}


def sha(value: str | bytes) -> str:
    return hashlib.sha256(value.encode() if isinstance(value, str) else value).hexdigest()


def document(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema_version": 1,
        "aliases": {
            "chat": {"upstream": "https://llm.internal:8443/v1", "timeout_s": 12, "retries": 1},
            "embed": {"upstream": "http://127.0.0.1:8081"},
        },
        "keys": {
            "team-a": {"secret": "env:TEAM_A_KEY", "aliases": ["chat", "embed"]},
            "team-b": {"secret": "env:TEAM_B_KEY", "aliases": ["embed"]},
        },
    }
    base.update(overrides)
    return base


def compile_(value: Any, environ: dict[str, str] | None = None, **kwargs: Any) -> Snapshot:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return compile_revision(
        raw,
        revision=kwargs.pop("revision", 7),
        generation=kwargs.pop("generation", 3),
        resolver=kwargs.pop("resolver", EnvFileResolver(ENV if environ is None else environ)),
    )


def refused(value: Any, environ: dict[str, str] | None = None, **kwargs: Any) -> RevisionError:
    with pytest.raises(RevisionError) as info:
        compile_(value, environ, **kwargs)
    assert info.value.revision == kwargs.get("revision", 7)
    return info.value


# -- a good revision ---------------------------------------------------------------


def test_compiles_to_a_snapshot_with_digests() -> None:
    snapshot = compile_(document())
    assert (snapshot.revision, snapshot.generation) == (7, 3)
    assert snapshot.aliases["chat"] == AliasSpec(
        upstream="https://llm.internal:8443/v1", timeout_s=12.0, retries=1
    )
    assert snapshot.aliases["embed"].timeout_s == 30.0
    assert snapshot.keys["team-a"] == KeyEntry(sha(SECRET_A), ("chat", "embed"))
    assert snapshot.keys["team-b"].digest == sha(SECRET_B)


def test_to_json_is_the_contract_shape() -> None:
    snapshot = compile_(document())
    value = json.loads(snapshot.to_json())
    assert list(value) == ["revision", "generation", "aliases", "keys"]
    assert value["revision"] == 7 and value["generation"] == 3
    assert value["aliases"]["chat"] == {
        "upstream": "https://llm.internal:8443/v1",
        "timeout_s": 12.0,
        "retries": 1,
    }
    assert value["keys"]["team-a"] == {"digest": sha(SECRET_A), "aliases": ["chat", "embed"]}
    assert value["keys"]["team-b"] == {"digest": sha(SECRET_B), "aliases": ["embed"]}


def test_snapshot_holds_digests_never_secrets_or_references() -> None:
    snapshot = compile_(document())
    raw = snapshot.to_json()
    for secret in (SECRET_A, SECRET_B):
        assert secret.encode() not in raw
        assert secret not in repr(snapshot)
    assert b"env:" not in raw


def test_etag() -> None:
    assert compile_(document(), revision=12, generation=5).etag() == '"12-5"'


def test_empty_revision_compiles() -> None:
    snapshot = compile_({"schema_version": 1})
    assert dict(snapshot.aliases) == {} and dict(snapshot.keys) == {}
    assert json.loads(snapshot.to_json())["keys"] == {}


def test_default_resolver_reads_the_live_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEAM_A_KEY", "from-the-process-environment")
    monkeypatch.setenv("TEAM_B_KEY", "another-one")
    raw = json.dumps(document()).encode()
    snapshot = compile_revision(raw, revision=1, generation=1)
    assert snapshot.keys["team-a"].digest == sha("from-the-process-environment")


# -- refusals by stage ----------------------------------------------------------------


def test_projection_names_key_and_alias() -> None:
    value = document()
    value["keys"]["team-b"]["aliases"] = ["embed", "chta"]
    error = refused(value)
    assert error.reason == reasons.PROJECTION
    assert error.detail == ("$.keys.team-b.aliases[1]: key 'team-b' names unknown alias 'chta'")


def test_projection_counts_further_dangling_references() -> None:
    value = document()
    value["keys"]["team-a"]["aliases"] = ["gone"]
    value["keys"]["team-b"]["aliases"] = ["also-gone", "missing"]
    error = refused(value)
    assert error.detail.startswith("$.keys.team-a.aliases[0]: key 'team-a' names unknown alias")
    assert error.detail.endswith("(2 more unknown alias references)")


def test_missing_env_secret_names_the_path_not_any_value() -> None:
    error = refused(document(), {"TEAM_A_KEY": SECRET_A})
    assert error.reason == reasons.SECRET
    assert error.detail == (
        "$.keys.team-b.secret: environment variable TEAM_B_KEY is not set or empty")
    assert SECRET_A not in str(error)


def test_empty_env_secret_is_refused() -> None:
    error = refused(document(), {"TEAM_A_KEY": "", "TEAM_B_KEY": SECRET_B})
    assert error.reason == reasons.SECRET
    assert error.detail == (
        "$.keys.team-a.secret: environment variable TEAM_A_KEY is not set or empty")


def test_duplicate_secret_is_a_snapshot_refusal() -> None:
    error = refused(document(), {"TEAM_A_KEY": SECRET_A, "TEAM_B_KEY": SECRET_A})
    assert error.reason == reasons.SNAPSHOT
    assert "'team-a' and 'team-b'" in error.detail
    assert SECRET_A not in str(error) and sha(SECRET_A) not in str(error)


@pytest.mark.parametrize(
    ("mutate", "environ", "reason"),
    [
        # incompatible outranks validation
        (lambda d: d.update(schema_version=2, extra=True), ENV, reasons.INCOMPATIBLE),
        # validation outranks projection
        (
            lambda d: (d["keys"]["team-a"].update(aliases=["nope"]), d.update(extra=1)),
            ENV,
            reasons.VALIDATION,
        ),
        # projection outranks secret
        (lambda d: d["keys"]["team-a"].update(aliases=["nope"]), {}, reasons.PROJECTION),
        # secret (a later key) outranks snapshot (an earlier pair)
        (
            lambda d: d["keys"].update({"team-c": {"secret": "env:UNSET", "aliases": ["chat"]}}),
            {"TEAM_A_KEY": "same", "TEAM_B_KEY": "same"},
            reasons.SECRET,
        ),
    ],
    ids=[
        "incompatible>validation",
        "validation>projection",
        "projection>secret",
        "secret>snapshot",
    ],
)
def test_stage_order_decides_the_reason(mutate: Any, environ: dict[str, str], reason: str) -> None:
    value = document()
    mutate(value)
    assert refused(value, environ).reason == reason


def test_decode_refusals_carry_the_revision() -> None:
    error = refused(b"\x00garbage", revision=99)
    assert (error.reason, error.revision) == (reasons.CORRUPT, 99)


# -- pluggable resolvers ----------------------------------------------------------------


class LeakyResolver:
    """Raises an error whose message quotes the secret it was looking at."""

    def resolve(self, reference: str) -> bytes:
        raise LookupError(f"vault said no for value {SECRET_A}")


class WrongReasonResolver:
    def resolve(self, reference: str) -> bytes:
        raise RevisionError(reasons.CORRUPT, f"backend unreadable for {reference}")


class ConstantResolver:
    def __init__(self, value: Any) -> None:
        self.value = value

    def resolve(self, reference: str) -> bytes:
        return self.value  # type: ignore[no-any-return]


def test_a_foreign_resolver_error_is_a_secret_refusal_without_its_message() -> None:
    error = refused(document(), resolver=LeakyResolver())
    assert error.reason == reasons.SECRET
    assert error.detail == (
        "$.keys.team-a.secret: env:TEAM_A_KEY could not be resolved (LookupError)"
    )
    assert SECRET_A not in str(error)
    # Neither chained nor in the context: a logged traceback would print it.
    assert error.__cause__ is None and error.__suppress_context__


def test_any_resolver_refusal_is_labelled_secret() -> None:
    error = refused(document(), resolver=WrongReasonResolver())
    assert error.reason == reasons.SECRET
    assert error.detail == "$.keys.team-a.secret: backend unreadable for env:TEAM_A_KEY"


@pytest.mark.parametrize("value", [b"", "a str, not bytes", None])
def test_resolver_returning_nothing_usable_is_a_secret_refusal(value: Any) -> None:
    value_doc = document()
    del value_doc["keys"]["team-b"]
    error = refused(value_doc, resolver=ConstantResolver(value))
    assert error.reason == reasons.SECRET
    assert error.detail.startswith("$.keys.team-a.secret: ")


# -- file secrets -----------------------------------------------------------------------


def file_document(reference: str) -> dict[str, Any]:
    return document(keys={"ops": {"secret": reference, "aliases": ["chat"]}})


@pytest.mark.parametrize(
    ("content", "secret"),
    [
        (b"tok-123\n", b"tok-123"),
        (b"tok-123\r\n", b"tok-123"),
        (b"tok-123", b"tok-123"),
        (b"tok-123\n\n", b"tok-123\n"),  # one newline only
        (b" spaced \n", b" spaced "),
    ],
)
def test_file_secret_strips_one_trailing_newline(
    tmp_path: Path, content: bytes, secret: bytes
) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    snapshot = compile_(file_document(f"file:{path}"))
    assert snapshot.keys["ops"].digest == sha(secret)


def test_relative_file_secret_resolves_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "ops.key").write_bytes(b"relative\n")
    monkeypatch.chdir(tmp_path)
    snapshot = compile_(file_document("file:secrets/ops.key"))
    assert snapshot.keys["ops"].digest == sha("relative")


def test_file_secret_follows_symlinks(tmp_path: Path) -> None:
    # Kubernetes mounts secrets as symlinks into a timestamped directory.
    (tmp_path / "real").write_bytes(b"linked")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert compile_(file_document(f"file:{tmp_path / 'link'}")).keys["ops"].digest == sha("linked")


def test_file_secret_refusals_say_the_same_whatever_the_cause(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"\n")
    large = tmp_path / "large"
    large.write_bytes(b"x" * (MAX_SECRET_BYTES + 1))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading must not block the compile
    unreadable = tmp_path / "unreadable"
    unreadable.write_bytes(b"s3cret")
    unreadable.chmod(0)
    cases = [tmp_path / "missing", empty / "below-a-file", empty, large, tmp_path, fifo]
    if os.geteuid() != 0:  # root reads a mode-0 file anyway
        cases.append(unreadable)
    for path in cases:
        error = refused(file_document(f"file:{path}"))
        assert error.reason == reasons.SECRET, path
        assert error.detail == (
            f"$.keys.ops.secret: secret file {path} cannot be resolved (it must be a "
            f"readable, non-empty regular file of at most {MAX_SECRET_BYTES} bytes, with one "
            "name)"
        )


def test_references_outside_the_allowed_prefixes_and_directories_are_refused(
    tmp_path: Path,
) -> None:
    allowed = tmp_path / "secrets"
    allowed.mkdir()
    (allowed / "team-a").write_bytes(b"in-dir")
    outside = tmp_path / "outside"
    outside.write_bytes(b"elsewhere")
    (allowed / "escape").symlink_to(outside)  # a link leading out of the directory
    resolver = EnvFileResolver(
        {"TEAM_A_KEY": "in-env", "SUPERVISOR_CONTROL_PLANE__URL": "postgresql://u:pw@h/db"},
        env_prefixes=["TEAM_"], dirs=[str(allowed)],
    )
    assert resolver.resolve("env:TEAM_A_KEY") == b"in-env"
    assert resolver.resolve(f"file:{allowed / 'team-a'}") == b"in-dir"

    def refusal(reference: str) -> str:
        with pytest.raises(RevisionError) as info:
            resolver.resolve(reference)
        assert info.value.reason == reasons.SECRET
        return info.value.detail

    assert refusal("env:SUPERVISOR_CONTROL_PLANE__URL") == (
        "environment variable SUPERVISOR_CONTROL_PLANE__URL is outside "
        "[revision].secret_env_prefixes")
    for path in ("/proc/self/environ", str(outside), f"{allowed}/../outside"):
        assert refusal(f"file:{path}") == (
            f"secret file {path} is outside [revision].secret_dirs"), path
    # Inside: missing, and a link out of the directory, read exactly alike.
    missing, escape = refusal(f"file:{allowed / 'nope'}"), refusal(f"file:{allowed / 'escape'}")
    assert missing.replace("nope", "X") == escape.replace("escape", "X")


def test_resolver_refuses_unknown_schemes_without_echoing_them() -> None:
    resolver = EnvFileResolver({})
    for reference in ("vault:kv/team", "sk-live-abc", "env:", "file:", ""):
        with pytest.raises(RevisionError) as info:
            resolver.resolve(reference)
        assert info.value.reason == reasons.SECRET
        assert info.value.detail.startswith("unsupported secret reference")
        assert "kv/team" not in info.value.detail and "sk-live" not in info.value.detail


# -- immutability -------------------------------------------------------------------------


def test_snapshot_attributes_cannot_be_set_or_deleted() -> None:
    snapshot = compile_(document())
    with pytest.raises(AttributeError):
        snapshot.revision = 8  # type: ignore[misc]
    with pytest.raises(AttributeError):
        snapshot.aliases = {}  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del snapshot.keys
    with pytest.raises(AttributeError):
        setattr(snapshot, "_key_dict", {})  # noqa: B010 - the private slots too
    assert snapshot.revision == 7 and len(snapshot.keys) == 2


def test_snapshot_mappings_are_read_only() -> None:
    snapshot = compile_(document())
    with pytest.raises(TypeError):
        snapshot.aliases["evil"] = AliasSpec(upstream="http://evil")  # type: ignore[index]
    with pytest.raises(TypeError):
        del snapshot.keys["team-a"]  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        snapshot.keys.clear()  # type: ignore[attr-defined]
    assert set(snapshot.keys) == {"team-a", "team-b"}


def test_snapshot_entries_are_frozen() -> None:
    snapshot = compile_(document())
    with pytest.raises(AttributeError):
        snapshot.aliases["chat"].upstream = "http://evil"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        snapshot.keys["team-a"].digest = "0" * 64  # type: ignore[misc]
    assert isinstance(snapshot.keys["team-a"].aliases, tuple)


def test_constructed_snapshot_copies_its_inputs() -> None:
    aliases = {"chat": AliasSpec(upstream="https://x")}
    keys = {"k": KeyEntry("ab" * 32, ("chat",))}
    snapshot = Snapshot(revision=1, generation=1, aliases=aliases, keys=keys)
    aliases.clear()
    keys["other"] = KeyEntry("cd" * 32, ("chat",))
    assert list(snapshot.aliases) == ["chat"] and list(snapshot.keys) == ["k"]


def test_snapshot_equality_and_repr() -> None:
    first, second = compile_(document()), compile_(document())
    assert first == second and hash(first) == hash(second)
    assert first != compile_(document(), generation=4)
    assert repr(first) == "Snapshot(revision=7, generation=3, aliases=2, keys=2)"


# -- concurrency ----------------------------------------------------------------------------


def test_compile_is_thread_safe() -> None:
    raw = json.dumps(document()).encode()
    resolver = EnvFileResolver(ENV)

    def run(generation: int) -> Snapshot:
        return compile_revision(raw, revision=7, generation=generation, resolver=resolver)

    with ThreadPoolExecutor(max_workers=8) as pool:
        snapshots = list(pool.map(run, range(64)))
    assert {s.keys["team-a"].digest for s in snapshots} == {sha(SECRET_A)}
    assert [s.generation for s in snapshots] == list(range(64))


async def test_compile_runs_in_a_trio_worker_thread() -> None:
    raw = json.dumps(document()).encode()
    snapshot = await trio.to_thread.run_sync(
        lambda: compile_revision(raw, revision=3, generation=1, resolver=EnvFileResolver(ENV))
    )
    assert snapshot.etag() == '"3-1"'
