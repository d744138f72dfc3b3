"""The diff, the TOML rendering and the --wait verdicts, on plain values."""

from __future__ import annotations

import msgspec

from supervisor.commands.revisions import diff_documents, render_changes, render_toml
from supervisor.commands.waiting import judge
from supervisor.revision.document import decode_body, document_from_object


def document(**tables: object) -> object:
    return document_from_object({"schema_version": 1, **tables})


def test_diff_names_each_field_and_compares_references_as_references() -> None:
    old = document(aliases={"chat": {"upstream": "https://a/v1"}, "gone": {"upstream": "http://g"}},
                   keys={"k": {"secret": "env:A", "aliases": ["chat"]}})
    new = document(aliases={"chat": {"upstream": "https://a/v1", "retries": 5},
                            "a.b": {"upstream": "http://n"}},
                   keys={"k": {"secret": "env:B", "aliases": ["chat", "a.b"]}})
    changes = diff_documents(old, new)  # type: ignore[arg-type]
    assert [(c.op, c.path) for c in changes] == [
        ("added", '$.aliases["a.b"]'),
        ("changed", "$.aliases.chat.retries"),
        ("removed", "$.aliases.gone"),
        ("changed", "$.keys.k.aliases"),
        ("changed", "$.keys.k.secret"),
    ]
    secret = changes[-1]
    assert (secret.old, secret.new) == ("env:A", "env:B")
    assert render_changes(changes)[-1] == '  ~ $.keys.k.secret: "env:A" -> "env:B"'
    assert diff_documents(new, new) == []  # type: ignore[arg-type]
    assert render_changes([]) == ["  no changes"]
    assert [c.op for c in diff_documents(None, new)] == ["added"] * 3  # type: ignore[arg-type]


def test_toml_rendering_round_trips() -> None:
    import tomllib

    doc = document(aliases={"a.b": {"upstream": "https://x/v1", "timeout_s": 0.5},
                            "chat": {"upstream": "http://c"}},
                   keys={"team-a": {"secret": "file:/run/s", "aliases": ["a.b", "chat"]}})
    text = render_toml(doc)  # type: ignore[arg-type]
    again = document_from_object(tomllib.loads(text))
    assert msgspec.json.encode(again) == msgspec.json.encode(doc)
    assert '[aliases."a.b"]' in text
    assert decode_body(msgspec.json.encode(again)) == again


def test_wait_verdicts() -> None:
    url = "http://r"
    assert judge({"type": "published", "revision": 4}, 4, url).state == "active"  # type: ignore[union-attr]
    assert judge({"type": "published", "revision": 3}, 4, url) is None
    refused = judge({"type": "rejected", "revision": 4, "reason": "secret",
                     "detail": "$.keys.k.secret:\n unset"}, 4, url)
    assert refused is not None and refused.state == "refused"
    assert (refused.reason, refused.detail) == ("secret", "$.keys.k.secret: unset")
    status = {"type": "status", "revision": {"active": 3, "last_rejection": None}}
    assert judge(status, 4, url) is None
    status["revision"] = {"active": 3, "last_rejection": {"revision": 4, "reason": "projection",
                                                          "detail": "d"}}
    assert judge(status, 4, url).state == "refused"  # type: ignore[union-attr]
    status["revision"] = {"active": 4, "last_rejection": {"revision": 4, "reason": "secret"}}
    assert judge(status, 4, url).state == "active"  # type: ignore[union-attr]
    status["revision"] = {"active": 5}
    assert judge(status, 4, url).state == "superseded"  # type: ignore[union-attr]
    for junk in (None, [], {"type": "status", "children": {}}, {"type": "ping"},
                 {"type": "status", "revision": {"active": True}}):
        assert judge(junk, 1, url) is None
