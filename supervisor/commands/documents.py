"""Revision documents for people: a TOML rendering (``show``) and a field-by-field diff.

Both work on decoded documents only: a key's ``secret`` is its reference
(``env:NAME``, ``file:PATH``), compared and printed as such. Nothing here
resolves a secret, so nothing here can print one.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from supervisor.revision.document import RevisionDocument, member_path

__all__ = ["Change", "diff_documents", "render_changes", "render_toml"]

Op = Literal["added", "removed", "changed"]
_SYMBOL = {"added": "+", "removed": "-", "changed": "~"}


class Change(msgspec.Struct, frozen=True, rename={"old": "from", "new": "to"}):
    """One difference: an alias or key added or removed (its whole entry), or one field changed.

    In JSON (``--json``'s ``changes``): ``op``, ``path``, ``from``, ``to``.
    """

    op: Op
    path: str
    old: Any = None
    new: Any = None


def _entries(doc: RevisionDocument | None, section: str) -> dict[str, dict[str, Any]]:
    if doc is None:
        return {}
    table = msgspec.to_builtins(getattr(doc, section))
    assert isinstance(table, dict)
    return table


def diff_documents(old: RevisionDocument | None, new: RevisionDocument) -> list[Change]:
    """What changes from ``old`` (None: nothing) to ``new``, sorted by section and name."""
    changes: list[Change] = []
    if old is not None and old.schema_version != new.schema_version:
        changes.append(Change("changed", "$.schema_version", old.schema_version,
                              new.schema_version))
    for section in ("aliases", "keys"):
        before, after = _entries(old, section), _entries(new, section)
        for name in sorted(before.keys() | after.keys()):
            path = member_path(f"$.{section}", name)
            if name not in before:
                changes.append(Change("added", path, None, after[name]))
            elif name not in after:
                changes.append(Change("removed", path, before[name], None))
            else:
                for field in sorted(before[name].keys() | after[name].keys()):
                    was, now = before[name].get(field), after[name].get(field)
                    if was != now:
                        changes.append(Change("changed", f"{path}.{field}", was, now))
    return changes


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def render_changes(changes: list[Change]) -> list[str]:
    """One line per change: ``+``/``-`` a whole entry, ``~`` one field ``old -> new``."""
    if not changes:
        return ["  no changes"]
    lines = []
    for change in changes:
        symbol = _SYMBOL[change.op]
        if change.op == "changed":
            lines.append(f"  {symbol} {change.path}: {_value(change.old)} -> "
                         f"{_value(change.new)}")
        else:
            entry = change.new if change.op == "added" else change.old
            lines.append(f"  {symbol} {change.path}: {_value(entry)}")
    return lines


def _toml_key(name: str) -> str:
    path = member_path("", name)
    # member_path quotes exactly the names TOML would need quoted too (as a JSON
    # string, which is a valid TOML basic string for the characters names may hold).
    return path[1:] if path.startswith(".") else path[1:-1]


def render_toml(doc: RevisionDocument) -> str:
    """The document as the TOML ``publish`` accepts, defaults written out."""
    lines = [f"schema_version = {doc.schema_version}"]
    for name, alias in sorted(doc.aliases.items()):
        lines += ["", f"[aliases.{_toml_key(name)}]",
                  f"upstream = {_value(alias.upstream)}",
                  f"timeout_s = {alias.timeout_s!r}",
                  f"retries = {alias.retries}"]
    for name, key in sorted(doc.keys.items()):
        lines += ["", f"[keys.{_toml_key(name)}]",
                  f"secret = {_value(key.secret)}",
                  f"aliases = {_value(list(key.aliases))}"]
    return "\n".join(lines) + "\n"
