"""Revision documents: decoding a stored body, every refusal with its reason and path, files."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import msgspec
import pytest

from supervisor import reasons
from supervisor.revision import (
    SCHEMA_VERSION,
    AliasSpec,
    RevisionError,
    decode_body,
    encode_document,
    load_document_file,
)

REPO = Path(__file__).resolve().parents[2]


def doc(**overrides: Any) -> dict[str, Any]:
    """A valid document; keyword arguments replace top-level members."""
    base: dict[str, Any] = {
        "schema_version": 1,
        "aliases": {"chat": {"upstream": "https://llm.internal:8443/v1"}},
        "keys": {"team-a": {"secret": "env:TEAM_A_KEY", "aliases": ["chat"]}},
    }
    base.update(overrides)
    return base


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


def refusal(raw: bytes) -> RevisionError:
    with pytest.raises(RevisionError) as info:
        decode_body(raw, revision=42)
    assert info.value.revision == 42
    return info.value


def with_alias(**fields: Any) -> bytes:
    return body(doc(aliases={"chat": {"upstream": "https://llm.internal/v1", **fields}}))


def with_key(name: str = "team-a", **fields: Any) -> bytes:
    spec = {"secret": "env:TEAM_A_KEY", "aliases": ["chat"], **fields}
    return body(doc(keys={name: spec}))


# -- success -------------------------------------------------------------------


def test_decode_fills_defaults() -> None:
    decoded = decode_body(body(doc()))
    assert decoded.schema_version == SCHEMA_VERSION == 1
    assert decoded.aliases["chat"] == AliasSpec(
        upstream="https://llm.internal:8443/v1", timeout_s=30.0, retries=2
    )
    assert decoded.keys["team-a"].aliases == ("chat",)


def test_decode_accepts_an_empty_document() -> None:
    decoded = decode_body(b'{"schema_version": 1}')
    assert decoded.aliases == {} and decoded.keys == {}


@pytest.mark.parametrize(
    "upstream",
    [
        "http://127.0.0.1:8080",
        "HTTPS://Upper.Example.COM/v1?x=1#frag",
        "http://[::1]:9000/v1",
        "http://llm_backend:80/",  # container networks use underscores
        "https://a.b.c.example./path/[not-a-host]",
        "https://x:65535",
    ],
)
def test_acceptable_upstreams(upstream: str) -> None:
    assert decode_body(with_alias(upstream=upstream)).aliases["chat"].upstream == upstream


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"a string"', b"null"])
def test_json_that_is_not_an_object_is_the_authors_to_fix(raw: bytes) -> None:
    with pytest.raises(RevisionError) as info:
        decode_body(raw)
    assert info.value.reason == reasons.VALIDATION
    assert info.value.detail.startswith("$: expected an object, got ")


# -- corrupt -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe{}",
        b'{"schema_version": 1, "aliases": {"\xff": {}}}',
        b"not json",
        b'{"schema_version": 1} trailing',
        b"",
        b"[" * 10_000,
        b'{"a":' * 10_000,
    ],
    ids=[
        "bom-like-bytes",
        "bad-utf8-in-key",
        "not-json",
        "trailing",
        "empty",
        "deep-array",
        "deep-object",
    ],
)
def test_corrupt_bodies(raw: bytes) -> None:
    assert refusal(raw).reason == reasons.CORRUPT


def test_invalid_utf8_wins_over_a_shape_error_before_it() -> None:
    # The typed decode stops at the unknown field; the bytes after it are
    # still not UTF-8, and corruption outranks shape.
    raw = b'{"schema_version": 1, "bogus": 1, "aliases": {"x": {"upstream": "\xff"}}}'
    assert refusal(raw).reason == reasons.CORRUPT


# -- schema_version --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        (None, "required field is missing"),
        ("1", "expected an integer, got a string"),
        (True, "expected an integer, got a boolean"),
        (1.0, "expected an integer, got a number"),
        (0, "must be >= 1"),
        (-3, "must be >= 1"),
    ],
)
def test_schema_version_must_be_a_positive_integer(value: Any, expect: str) -> None:
    value_doc = doc()
    if value is None:
        del value_doc["schema_version"]
    else:
        value_doc["schema_version"] = value
    error = refusal(body(value_doc))
    assert error.reason == reasons.VALIDATION
    assert error.detail.startswith(f"$.schema_version: {expect}")


def test_newer_schema_version_is_incompatible_even_when_shaped_like_v1() -> None:
    error = refusal(body(doc(schema_version=SCHEMA_VERSION + 1)))
    assert error.reason == reasons.INCOMPATIBLE
    assert f"schema_version {SCHEMA_VERSION + 1}" in error.detail


def test_newer_schema_version_with_another_shape_is_incompatible_not_invalid() -> None:
    raw = body({"schema_version": 2, "routes": [{"to": "x"}], "aliases": ["changed"]})
    assert refusal(raw).reason == reasons.INCOMPATIBLE


def test_huge_schema_version_is_incompatible() -> None:
    assert refusal(b'{"schema_version": 100000000000000000000000000}').reason == (
        reasons.INCOMPATIBLE
    )


def test_out_of_range_schema_version_number_is_validation() -> None:
    error = refusal(b'{"schema_version": 1e400}')
    assert (error.reason, error.detail) == (
        reasons.VALIDATION,
        "$.schema_version: expected an integer, got a number",
    )


# -- validation, with the path -----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        (with_alias(timeout_s=0), "$.aliases.chat.timeout_s", "> 0"),
        (with_alias(timeout_s=-1.5), "$.aliases.chat.timeout_s", "> 0"),
        (with_alias(timeout_s="30"), "$.aliases.chat.timeout_s", "got `str`"),
        (with_alias(timeout_s=100_000), "$.aliases.chat.timeout_s", "<= 86400"),
        (with_alias(retries=11), "$.aliases.chat.retries", "<= 10"),
        (with_alias(retries=-1), "$.aliases.chat.retries", ">= 0"),
        (with_alias(retries=2.5), "$.aliases.chat.retries", "got `float`"),
        (with_alias(retries=True), "$.aliases.chat.retries", "got `bool`"),
        (with_alias(timeout=3), "$.aliases.chat", "unknown field `timeout`"),
        (body(doc(aliases={"chat": {}})), "$.aliases.chat", "missing required field `upstream`"),
        (body(doc(aliases={"chat": "https://x"})), "$.aliases.chat", "Expected `object`"),
        (body(doc(aliases=["chat"])), "$.aliases", "expected an object"),
        (body(doc(keys=None)), "$.keys", "expected an object, got null"),
        (body(doc(extra=1)), "$", "unknown field `extra`"),
        (with_alias(upstream=""), "$.aliases.chat.upstream", "length >= 1"),
        (with_alias(upstream="ftp://llm/v1"), "$.aliases.chat.upstream", "http or https"),
        (with_alias(upstream="llm.internal/v1"), "$.aliases.chat.upstream", "absolute"),
        (with_alias(upstream="https://"), "$.aliases.chat.upstream", "has no host"),
        (with_alias(upstream="https:///v1"), "$.aliases.chat.upstream", "has no host"),
        (with_alias(upstream="https://x:0"), "$.aliases.chat.upstream", "port"),
        (with_alias(upstream="https://x:65536"), "$.aliases.chat.upstream", "port"),
        (with_alias(upstream="https://x:08443"), "$.aliases.chat.upstream", "port"),
        (with_alias(upstream="https://x:"), "$.aliases.chat.upstream", "port"),
        (with_alias(upstream="https://[zz::1]/"), "$.aliases.chat.upstream", "host"),
        (with_alias(upstream="https://-bad-.x/"), "$.aliases.chat.upstream", "host"),
        (with_alias(upstream="https://x/a b"), "$.aliases.chat.upstream", "whitespace"),
        (with_alias(upstream="https://x\n"), "$.aliases.chat.upstream", "whitespace"),
        (
            body(doc(aliases={"bad name": {"upstream": "https://x"}}, keys={})),
            '$.aliases["bad name"]',
            "not a valid alias name",
        ),
        (
            # "$" in a pattern would accept a trailing newline; names must not.
            body(doc(aliases={"chat\n": {"upstream": "https://x"}}, keys={})),
            '$.aliases["chat\\n"]',
            "not a valid alias name",
        ),
        (
            body(doc(aliases={"x" * 64: {"upstream": "https://x"}}, keys={})),
            f"$.aliases.{'x' * 64}",
            "not a valid alias name",
        ),
        (with_key(name="-team"), "$.keys.-team", "not a valid key name"),
        (with_key(secret="TEAM_A_KEY"), "$.keys.team-a.secret", '"env:NAME"'),
        (with_key(secret="env:"), "$.keys.team-a.secret", '"env:NAME"'),
        (with_key(secret="env:1BAD"), "$.keys.team-a.secret", '"env:NAME"'),
        (with_key(secret="file:"), "$.keys.team-a.secret", '"env:NAME"'),
        (with_key(secret="vault:kv/x"), "$.keys.team-a.secret", '"env:NAME"'),
        (with_key(secret=7), "$.keys.team-a.secret", "Expected `str`"),
        (with_key(aliases=[]), "$.keys.team-a.aliases", "length >= 1"),
        (with_key(aliases="chat"), "$.keys.team-a.aliases", "Expected `array`"),
        (with_key(aliases=["chat", "chat"]), "$.keys.team-a.aliases[1]", "listed twice"),
        (with_key(aliases=["chat", "no good"]), "$.keys.team-a.aliases[1]", "invalid alias name"),
        (with_key(aliases=[3]), "$.keys.team-a.aliases[0]", "Expected `str`"),
        (with_key(extra=True), "$.keys.team-a", "unknown field `extra`"),
        (
            body(doc(aliases={"v1.chat": {"upstream": "https://x", "retries": 99}}, keys={})),
            '$.aliases["v1.chat"].retries',
            "<= 10",
        ),
    ],
)
def test_validation_names_the_path(raw: bytes, path: str, words: str) -> None:
    error = refusal(raw)
    assert error.reason == reasons.VALIDATION
    assert error.detail.startswith(f"{path}: "), error.detail
    assert words in error.detail


def test_number_out_of_range_is_validation() -> None:
    error = refusal(
        b'{"schema_version": 1, "aliases": {"a": {"upstream": "http://h", "timeout_s": 1e400}}}'
    )
    assert error.reason == reasons.VALIDATION
    assert "timeout_s" in error.detail


def test_upstream_refusals_do_not_echo_the_url() -> None:
    # An upstream may embed a password; the refusal must not copy it into logs.
    error = refusal(with_alias(upstream="https://admin:hunter2@llm.internal/v1"))
    assert error.detail.startswith("$.aliases.chat.upstream: must not embed credentials")
    assert "hunter2" not in str(error)


def test_malformed_secret_reference_is_not_echoed() -> None:
    # A reference without a scheme is most likely the secret pasted in.
    error = refusal(with_key(secret="sk-live-0123456789abcdef"))
    assert "sk-live-0123456789abcdef" not in str(error)


def test_first_error_in_document_order() -> None:
    raw = body(
        doc(
            aliases={
                "a": {"upstream": "https://ok"},
                "b": {"upstream": "https://ok", "retries": 20},
                "c": {"upstream": "gopher://x"},
            },
            keys={},
        )
    )
    assert refusal(raw).detail.startswith("$.aliases.b.retries: ")


# -- the error type --------------------------------------------------------------


def test_revision_error_carries_reason_detail_revision() -> None:
    error = RevisionError(reasons.PROJECTION, "$.keys.k.aliases[0]: gone", revision=9)
    assert (error.reason, error.detail, error.revision) == (
        "projection",
        "$.keys.k.aliases[0]: gone",
        9,
    )
    assert str(error) == "revision 9 refused (projection): $.keys.k.aliases[0]: gone"
    assert "revision refused (secret)" in str(RevisionError(reasons.SECRET, "x"))


def test_revision_error_refuses_an_uncatalogued_reason() -> None:
    with pytest.raises(ValueError, match="uncatalogued"):
        RevisionError("Validation", "typo in the label")


def test_revision_error_survives_pickling() -> None:
    error = pickle.loads(pickle.dumps(RevisionError(reasons.SNAPSHOT, "dup", revision=3)))
    assert (error.reason, error.detail, error.revision) == ("snapshot", "dup", 3)


# -- files -------------------------------------------------------------------------

TOML_DOC = """
schema_version = 1

[aliases.zeta]
upstream = "https://z.internal/v1"

[aliases.alpha]
upstream = "http://a.internal:8080"
timeout_s = 2.5
retries = 0

[keys.team-a]
secret = "env:TEAM_A_KEY"
aliases = ["zeta", "alpha"]
"""


def test_toml_file_gives_canonical_json(tmp_path: Path) -> None:
    path = tmp_path / "rev.toml"
    path.write_text(TOML_DOC)
    version, canonical = load_document_file(path)
    assert version == 1
    value = json.loads(canonical)
    # Defaults written out; names sorted; the body decodes by the stored-body rules.
    assert list(value["aliases"]) == ["alpha", "zeta"]
    assert value["aliases"]["zeta"] == {
        "upstream": "https://z.internal/v1",
        "timeout_s": 30.0,
        "retries": 2,
    }
    assert decode_body(canonical).keys["team-a"].aliases == ("zeta", "alpha")


def test_json_and_toml_files_give_the_same_body(tmp_path: Path) -> None:
    toml_path = tmp_path / "rev.toml"
    toml_path.write_text(TOML_DOC)
    json_path = tmp_path / "rev.json"
    json_path.write_bytes(msgspec.json.encode(msgspec.toml.decode(TOML_DOC.encode())))
    assert load_document_file(toml_path) == load_document_file(str(json_path))


def test_canonical_body_is_a_fixed_point(tmp_path: Path) -> None:
    path = tmp_path / "rev.toml"
    path.write_text(TOML_DOC)
    _, canonical = load_document_file(path)
    assert encode_document(decode_body(canonical)) == canonical


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_file_with_a_byte_order_mark_loads(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"rev{suffix}"
    text = TOML_DOC if suffix == ".toml" else json.dumps(doc())
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_document_file(path)[0] == 1


def test_file_without_known_suffix_is_sniffed(tmp_path: Path) -> None:
    as_json = tmp_path / "rev.txt"
    as_json.write_text(json.dumps(doc()))
    as_toml = tmp_path / "rev.conf"
    as_toml.write_text(TOML_DOC)
    assert load_document_file(as_json)[0] == load_document_file(as_toml)[0] == 1


@pytest.mark.parametrize(
    ("name", "content", "reason", "words"),
    [
        ("bad.toml", "schema_version = = 1", reasons.VALIDATION, "$: not TOML"),
        ("bad.toml", b"schema_version = 1\n# \xff\n", reasons.CORRUPT, "not UTF-8"),
        ("bad.json", "{", reasons.CORRUPT, "not JSON"),
        ("new.toml", "schema_version = 2\n[routes]\n", reasons.INCOMPATIBLE, "schema_version 2"),
        (
            "bad.toml",
            'schema_version = 1\n[aliases.chat]\nupstream = "https://x"\ntimeout_s = 0\n',
            reasons.VALIDATION,
            "$.aliases.chat.timeout_s: ",
        ),
        (
            "inf.toml",
            'schema_version = 1\n[aliases.chat]\nupstream = "https://x"\ntimeout_s = inf\n',
            reasons.VALIDATION,
            "$.aliases.chat.timeout_s: ",
        ),
        (
            "date.toml",
            'schema_version = 1\n[aliases.chat]\nupstream = "https://x"\nretries = 2024-01-01\n',
            reasons.VALIDATION,
            "$.aliases.chat.retries: ",
        ),
        ("version.toml", 'schema_version = "1"\n', reasons.VALIDATION, "$.schema_version: "),
        ("extra.toml", "schema_version = 1\nx = 1\n", reasons.VALIDATION, "unknown field `x`"),
    ],
)
def test_file_refusals_name_the_file(
    tmp_path: Path, name: str, content: str | bytes, reason: str, words: str
) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(RevisionError) as info:
        load_document_file(path)
    assert info.value.reason == reason
    assert info.value.detail.startswith(f"{path}: ")
    assert words in info.value.detail


def test_unreadable_file_is_corrupt_with_the_os_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(RevisionError) as info:
        load_document_file(missing)
    assert info.value.reason == reasons.CORRUPT
    assert str(missing) in info.value.detail
    assert "No such file or directory" in info.value.detail


def test_shipped_example_is_valid() -> None:
    version, canonical = load_document_file(REPO / "conf" / "example-revision.toml")
    parsed = decode_body(canonical)
    assert version == 1
    assert len(parsed.aliases) == 2 and len(parsed.keys) == 1
    assert all(key.secret.startswith("file:") for key in parsed.keys.values())
