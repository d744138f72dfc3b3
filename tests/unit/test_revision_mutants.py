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
