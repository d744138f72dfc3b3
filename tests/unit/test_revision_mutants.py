"""Revision documents and compilation: what the mutation run found unasserted.

Bracketed hosts that are not IPv6, the TOML path's own checks, the version
checks' boundaries, and the compile stages' labels (a transient shortage while
reading a secret stays ``unavailable``).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from supervisor import reasons
from supervisor.revision.compile import compile_revision
from supervisor.revision.document import decode_body, document_from_object, load_document_file
from supervisor.revision.errors import RevisionError
from supervisor.revision.secrets import EnvFileResolver


def body(**top: object) -> bytes:
    return json.dumps({"schema_version": 1, **top}).encode()


class Shortage:
    """A resolver meeting EMFILE, as EnvFileResolver reports it."""

    def resolve(self, reference: str) -> bytes:
        raise RevisionError(reasons.UNAVAILABLE, "secret file /s: Too many open files "
                                                 "(transient; retried)")


def test_a_transient_secret_shortage_stays_unavailable_through_compile() -> None:
    doc = body(aliases={"a": {"upstream": "https://a.internal"}},
               keys={"k": {"secret": "file:/s", "aliases": ["a"]}})
    with pytest.raises(RevisionError) as info:
        compile_revision(doc, revision=4, generation=1, resolver=Shortage())
    assert info.value.reason == reasons.UNAVAILABLE
    assert info.value.revision == 4
    assert info.value.detail.startswith("$.keys.k.secret: ")


def test_an_emfile_reading_a_secret_file_is_unavailable_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = tmp_path / "s"
    secret.write_text("v")
    real_open = __import__("os").open

    def exhausted(path: object, *args: object, **kwargs: object) -> int:
        if str(path) == str(secret):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr("supervisor.revision.secrets.os.open", exhausted)
    doc = body(aliases={"a": {"upstream": "https://a.internal"}},
               keys={"k": {"secret": f"file:{secret}", "aliases": ["a"]}})
    with pytest.raises(RevisionError) as info:
        compile_revision(doc, revision=1, generation=1, resolver=EnvFileResolver({}))
    assert info.value.reason == reasons.UNAVAILABLE


# -- bracketed hosts ------------------------------------------------------------------------

@pytest.mark.parametrize("upstream", [
    "http://[1.2.3.4]/", "https://[::1:2:3:4:5:6:7:8:9]/", "http://[:::]/", "http://[1::2::3]:80/",
])
def test_a_bracketed_host_that_is_not_ipv6_is_refused(upstream: str) -> None:
    with pytest.raises(RevisionError) as info:
        decode_body(body(aliases={"a": {"upstream": upstream}}), revision=2)
    assert info.value.reason == reasons.VALIDATION
    assert info.value.detail == (
        "$.aliases.a.upstream: host must be a DNS name or an IP address (IPv6 in brackets)")


@pytest.mark.parametrize("upstream", [
    "http://[::1]/", "https://[2001:db8::7]:8443/v1", "http://[::ffff:1.2.3.4]",
])
def test_a_bracketed_ipv6_host_is_accepted(upstream: str) -> None:
    doc = decode_body(body(aliases={"a": {"upstream": upstream}}))
    assert doc.aliases["a"].upstream == upstream


def test_a_bad_bracketed_host_after_good_ones_is_named() -> None:
    aliases = {"a": {"upstream": "http://[::1]/"}, "b": {"upstream": "http://ok.internal"},
               "c": {"upstream": "http://[1.2.3.4]/"}}
    with pytest.raises(RevisionError) as info:
        decode_body(body(aliases=aliases))
    assert info.value.detail.startswith("$.aliases.c.upstream: ")


# -- the TOML path validates by the same rules ----------------------------------------------


def test_document_from_object_applies_the_document_rules() -> None:
    with pytest.raises(RevisionError) as info:
        document_from_object({"schema_version": 1,
                              "aliases": {"a": {"upstream": "http://[1.2.3.4]/"}}}, revision=3)
    assert info.value.reason == reasons.VALIDATION and info.value.revision == 3
    with pytest.raises(RevisionError) as info:
        document_from_object({"schema_version": 1, "aliases": {"a": {"upstream": "http://a"}},
                              "keys": {"k": {"secret": "env:K", "aliases": ["a", "a"]}}})
    assert info.value.detail == "$.keys.k.aliases[1]: alias 'a' is listed twice"


def test_a_toml_file_is_checked_before_encoding(tmp_path: Path) -> None:
    path = tmp_path / "rev.toml"
    path.write_text('schema_version = 1\n[aliases.a]\nupstream = "http://[1.2.3.4]/"\n')
    with pytest.raises(RevisionError) as info:
        load_document_file(path)
    assert info.value.reason == reasons.VALIDATION
    assert info.value.detail == (
        f"{path}: $.aliases.a.upstream: host must be a DNS name or an IP address "
        "(IPv6 in brackets)")
