"""Label and field selectors of the fake Kubernetes API server (lists, watches, deletes).

Follows ``k8s.io/apimachinery/pkg/labels``: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``,
``k in (a,b)``, ``k notin (a,b)``; ``!=`` and ``notin`` match objects without the label; a
malformed selector is a 400 ``BadRequest``. Field selectors cover ``metadata.name`` and
``metadata.namespace`` only (other fields: 400 "field label not supported", as for most
resources of the real server).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tests.fakes.apiserver_errors import bad_request
from tests.fakes.apiserver_resources import Obj


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" match objects without the label, as the real server does
        return not present or value not in self.values


_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VAL = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\(\s*(?P<values>[^()]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VAL})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


def _split_top(selector: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_label_selector(selector: str | None) -> tuple[Requirement, ...]:
    """Parse ``k=v,k!=v,k,!k,k in (a,b),k notin (a,b)``; 400 on a malformed selector."""
    if not selector or not selector.strip():
        return ()
    reqs: list[Requirement] = []
    for raw in _split_top(selector):
        if not raw.strip():
            raise bad_request(f"unable to parse requirement: empty requirement in {selector!r}")
        if m := _SET_RE.match(raw):
            values = tuple(v.strip() for v in m["values"].split(",") if v.strip())
            if not values:
                raise bad_request(f"unable to parse requirement: {raw!r}: no values")
            reqs.append(Requirement(m["key"], m["op"], values))
            continue
        if m := _EQ_RE.match(raw):
            op = "!=" if m["op"] == "!=" else "="
            reqs.append(Requirement(m["key"], op, (m["value"],)))
            continue
        if m := _EXISTS_RE.match(raw):
            reqs.append(Requirement(m["key"], "!" if m["neg"] else "exists"))
            continue
        raise bad_request(f"unable to parse requirement: found {raw.strip()!r}")
    return tuple(reqs)


def labels_match(reqs: Iterable[Requirement], obj: Obj) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if not isinstance(labels, dict):
        labels = {}
    return all(r.matches(labels) for r in reqs)


_FIELDS = {"metadata.name": ("name",), "metadata.namespace": ("namespace",)}


def parse_field_selector(selector: str | None) -> tuple[tuple[str, str, str], ...]:
    """``metadata.name=x``, ``metadata.namespace!=y`` (comma-joined)."""
    if not selector or not selector.strip():
        return ()
    out = []
    for raw in selector.split(","):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", raw)
        if not m:
            raise bad_request(f"invalid field selector: {raw!r}")
        if m.group(1) not in _FIELDS:
            raise bad_request(f'field label not supported: {m.group(1)}')
        out.append((m.group(1), "!=" if m.group(2) == "!=" else "=", m.group(3)))
    return tuple(out)


def fields_match(reqs: Iterable[tuple[str, str, str]], obj: Obj) -> bool:
    md = obj.get("metadata") or {}
    for fld, op, value in reqs:
        actual = md.get(_FIELDS[fld][0], "") or ""
        if (actual == value) != (op == "="):
            return False
    return True


__all__ = [
    "Requirement",
    "fields_match",
    "labels_match",
    "parse_field_selector",
    "parse_label_selector",
]
