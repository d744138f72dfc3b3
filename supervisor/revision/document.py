"""The revision document, schema_version 1: its types, decoding, and file loading.

:class:`RevisionDocument` is the shape; :func:`decode_body` reads a stored body (UTF-8 JSON).
Names match :data:`NAME_PATTERN`. Operators: docs/revision-schema.md (the fields and bounds).
"""

from __future__ import annotations

import ipaddress
import math
import re
from itertools import chain
from operator import attrgetter
from typing import Annotated, Any, Final

import msgspec

from supervisor import reasons
from supervisor.bounds import NAME_BYTES, quoted, shown
from supervisor.revision.errors import RevisionError

__all__ = [
    "NAME_PATTERN",
    "SCHEMA_VERSION",
    "AliasSpec",
    "KeySpec",
    "RevisionDocument",
    "decode_body",
    "document_from_object",
    "encode_document",
    "member_path",
]

SCHEMA_VERSION: Final[int] = 1
"""The highest ``schema_version`` this build reads."""

# Names and secret references are checked by the Python pass below rather than
# by msgspec ``Meta(pattern=...)``: msgspec calls back into ``re`` once per
# value, which tripled the decode time of a 100,000-alias body, while one
# ``all(map(pattern.fullmatch, ...))`` over the decoded values stays in C.
NAME_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
"""Alias and key names (full match)."""
_NAME: Final = re.compile(NAME_PATTERN)
_NAME_RULE = "names are 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit"
# The env form takes a portable shell variable name; a file path is anything
# without control characters (relative paths resolve against the working directory).
_SECRET: Final = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]{0,254}|file:[^\x00-\x1f\x7f]{1,4095}")
_SECRET_RULE = 'must be "env:NAME" (NAME a shell variable name) or "file:PATH"'

_MAX_TIMEOUT_S: Final = 86_400.0  # a day; also keeps inf out of a float field


# -- the one rule for an alias's upstream: an absolute http(s) URL with a host and no
# credentials. UPSTREAM_URL (full match) plus ipv6_ok decide; explain_upstream says why a
# URL fails, without echoing it (it may hold credentials).

# An absolute http(s) URL whose authority is a host (DNS-like name, or a
# bracketed IPv6 literal) and an optional port from 1 to 65535; no userinfo, no
# whitespace or control characters anywhere. Underscores are allowed in names
# because container networks use them.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
UPSTREAM_URL: Final = re.compile(
    rf"(?i:https?)://(?:{_LABEL}(?:\.{_LABEL})*\.?|\[[0-9A-Fa-f:.]+\])"
    rf"(?::{_PORT})?(?:[/?#][^\x00-\x20\x7f]*)?"
)


def ipv6_ok(url: str) -> bool:
    """False when ``url``'s host is bracketed but not an IPv6 address."""
    authority = url.partition("://")[2]
    if not authority.startswith("["):
        return True
    try:
        ipaddress.IPv6Address(authority[1 : authority.find("]")])
    except ValueError:
        return False
    return True


def explain_upstream(url: str) -> str:
    """Why ``url`` is not an acceptable upstream. Never echoes the URL: it may hold credentials."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "must be an absolute http or https URL (scheme://host...)"
    if scheme.lower() not in ("http", "https"):
        return "must be an http or https URL"
    if re.search(r"[\x00-\x20\x7f]", url):
        return "must not contain whitespace or control characters"
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        return "must not embed credentials (user@host); give clients a key instead"
    if not authority:
        return "has no host"
    found = re.fullmatch(r"(?P<host>.*?)(?::(?P<port>[^:\]]*))?", authority)
    port = found.group("port") if found else None
    if port is not None and not re.fullmatch(_PORT, port):
        return "port must be a number from 1 to 65535 (no leading zeros)"
    return "host must be a DNS name or an IP address (IPv6 in brackets)"


# gc=False: these instances hold only str/int/float/tuple-of-str, so they can
# never be part of a reference cycle; untracked they cost the garbage collector
# nothing, which matters when a revision holds 100,000 of them.
class AliasSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, gc=False):
    """One ``[aliases.NAME]`` table. Also the snapshot's alias entry (reused, not copied)."""

    upstream: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=_MAX_TIMEOUT_S)] = 30.0
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 2


class KeySpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, gc=False):
    """One ``[keys.NAME]`` table: a secret reference and the aliases it may use."""

    secret: str
    aliases: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)]


class RevisionDocument(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A whole revision document. Frozen; its dictionaries belong to whoever decoded it."""

    schema_version: int
    aliases: dict[str, AliasSpec] = msgspec.field(default_factory=dict)
    keys: dict[str, KeySpec] = msgspec.field(default_factory=dict)


_DECODER: Final = msgspec.json.Decoder(RevisionDocument)  # thread-safe since msgspec 0.16
_ENCODER: Final = msgspec.json.Encoder(order="deterministic")


def member_path(parent: str, name: str) -> str:
    """``$.aliases`` + ``chat`` -> ``$.aliases.chat``; other names quoted: ``$.aliases["a.b"]``.

    A name no valid one could be (past :data:`~supervisor.bounds.NAME_BYTES`, or
    not printable once JSON-quoted) is quoted with escapes and cut
    (:func:`~supervisor.bounds.quoted`): a path names it inside a refusal's detail.
    """
    if len(name) <= NAME_BYTES and _PLAIN_MEMBER.fullmatch(name):
        return f"{parent}.{name}"
    spelled = msgspec.json.encode(name).decode()
    if len(spelled) <= NAME_BYTES and spelled.isprintable():
        return f"{parent}[{spelled}]"
    return f"{parent}[{quoted(name)}]"


_PLAIN_MEMBER: Final = re.compile(r"[A-Za-z0-9_-]+")


def decode_body(body: bytes, *, revision: int | None = None) -> RevisionDocument:
    """Decode and validate a stored revision body (UTF-8 JSON).

    Raises :class:`RevisionError` and nothing else for any body, in this order:

    1. ``corrupt``: not UTF-8, or not JSON (also nested too deeply).
    2. ``validation``: JSON that is not an object (an array is the author's to fix,
       not damage), or ``schema_version`` missing, not an integer or below 1.
    3. ``incompatible``: ``schema_version`` above :data:`SCHEMA_VERSION`, whatever the rest.
       A newer schema may have a different shape.
    4. ``validation``: any other shape or constraint error.
       ``detail`` starts with the offending ``$.path`` (``$.aliases.chat.timeout_s``).

    Cross-references and secrets are the compile stage's (:mod:`supervisor.revision.compile`).

    Built for bodies of 100,000 aliases: success is one typed msgspec decode.
    Types, required fields and bounds are msgspec ``Meta``, checked in C.
    One pass of C-level ``map`` calls does the rest: names, secret references, URLs, repeats.
    Only a refusal walks the document in Python to name the first offender.
    msgspec reports a dict value's path as ``$.aliases[...]``, without the name.
    So a failed typed decode decodes again, untyped, to classify it and name the entry.
    """
    try:
        return _decode_body(body, revision)
    except (RecursionError, ValueError, UnicodeError) as exc:
        # The safety net for hostile input the decoders below let through.
        raise RevisionError(
            reasons.VALIDATION, f"$: cannot be processed: {exc}", revision=revision
        ) from None


def _decode_body(body: bytes, revision: int | None) -> RevisionDocument:
    try:
        doc = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        # Ordering matters: ValidationError subclasses DecodeError.
        raise _explain_failure(body, exc, revision) from None
    except msgspec.DecodeError as exc:
        raise RevisionError(reasons.CORRUPT, f"not JSON: {exc}", revision=revision) from None
    except RecursionError:
        raise RevisionError(reasons.CORRUPT, "JSON nested too deeply", revision=revision) from None
    _check_version(doc.schema_version, revision)
    _check_document(doc, revision)
    return doc


def document_from_object(obj: object, *, revision: int | None = None) -> RevisionDocument:
    """Validate an already-parsed document (a TOML file's tables) by the same rules.

    So a file (:mod:`supervisor.revision.files`) and the body it becomes get one verdict.
    """
    if not isinstance(obj, dict):
        raise RevisionError(reasons.VALIDATION, f"$: expected an object, got {_kind(obj)}",
                            revision=revision)
    _check_version(obj.get("schema_version", _MISSING), revision)
    try:
        doc = msgspec.convert(obj, RevisionDocument)
    except msgspec.ValidationError as exc:
        raise RevisionError(
            reasons.VALIDATION, _locate(obj) or _rebase(_suggest(str(exc), RevisionDocument), "$"),
            revision=revision
        ) from None
    _check_document(doc, revision)
    return doc


def encode_document(doc: RevisionDocument) -> bytes:
    """The canonical body of ``doc``: UTF-8 JSON, defaults written out, names sorted.

    Writing defaults out means the stored revision says exactly what runs, even
    if a later build changes a default.
    """
    return _ENCODER.encode(doc)


# -- validation beyond msgspec ------------------------------------------------

_MISSING: Final = object()


def _check_version(version: object, revision: int | None) -> None:
    if version is _MISSING:
        raise RevisionError(
            reasons.VALIDATION, "$.schema_version: required field is missing", revision=revision
        )
    if not isinstance(version, int) or isinstance(version, bool):
        raise RevisionError(
            reasons.VALIDATION,
            f"$.schema_version: expected an integer, got {_kind(version)}",
            revision=revision,
        )
    if version > SCHEMA_VERSION:
        raise RevisionError(
            reasons.INCOMPATIBLE,
            f"schema_version {version} is newer than this build reads "
            f"(at most {SCHEMA_VERSION}); deploy a newer build to serve it",
            revision=revision,
        )
    if version < 1:
        raise RevisionError(
            reasons.VALIDATION, f"$.schema_version: must be >= 1, got {version}", revision=revision
        )


def _check_document(doc: RevisionDocument, revision: int | None) -> None:
    """The constraints msgspec does not check, on an already-typed document.

    One C-level pass per rule answers "is everything fine?"; only a refusal
    walks the document in Python, in document order, to name the first offender.
    """
    aliases, keys = doc.aliases, doc.keys
    listed = list(map(_ALIASES_OF, keys.values()))
    fine = (
        all(map(_NAME.fullmatch, aliases))
        and all(map(UPSTREAM_URL.fullmatch, map(_UPSTREAM_OF, aliases.values())))
        and all(map(_NAME.fullmatch, keys))
        and all(map(_SECRET.fullmatch, map(_SECRET_OF, keys.values())))
        # A name that is a defined alias is valid (checked above): the cheap
        # membership test settles the usual case, the pattern the rest.
        and (
            all(map(aliases.__contains__, chain.from_iterable(listed)))
            or all(map(_NAME.fullmatch, chain.from_iterable(listed)))
        )
        # No repeats: a frozenset of each list is as long as the list.
        and sum(map(len, listed)) == sum(map(len, map(frozenset, listed)))
    )
    if fine:
        # The URL pattern cannot tell a well-formed IPv6 literal; the rare
        # bracketed host gets a precise look.
        fine = all(ipv6_ok(a.upstream) for a in aliases.values() if "[" in a.upstream)
    if not fine:
        # The walk cannot disagree with the passes above; if it ever did, the
        # document is still refused rather than let through.
        problem = _first_violation(doc) or "$: the document breaks a constraint"
        raise RevisionError(reasons.VALIDATION, problem, revision=revision)


_UPSTREAM_OF: Final = attrgetter("upstream")
_SECRET_OF: Final = attrgetter("secret")
_ALIASES_OF: Final = attrgetter("aliases")


def _first_violation(doc: RevisionDocument) -> str | None:
    """``$.path: why`` for the first entry breaking a rule of :func:`_check_document`."""
    for name, alias in doc.aliases.items():
        here = member_path("$.aliases", name)
        if not _NAME.fullmatch(name):
            return f"{here}: not a valid alias name: {_NAME_RULE}"
        if not (UPSTREAM_URL.fullmatch(alias.upstream) and ipv6_ok(alias.upstream)):
            return f"{here}.upstream: {explain_upstream(alias.upstream)}"
    for name, key in doc.keys.items():
        here = member_path("$.keys", name)
        if not _NAME.fullmatch(name):
            return f"{here}: not a valid key name: {_NAME_RULE}"
        if not _SECRET.fullmatch(key.secret):
            # Never echo the value: a malformed reference is often a pasted secret.
            return f"{here}.secret: {_SECRET_RULE}"
        seen: set[str] = set()
        for index, alias_name in enumerate(key.aliases):
            if not _NAME.fullmatch(alias_name):
                return f"{here}.aliases[{index}]: invalid alias name: {_NAME_RULE}"
            if alias_name in seen:
                return f"{here}.aliases[{index}]: alias {quoted(alias_name)} is listed twice"
            seen.add(alias_name)
    return None


# -- the failure path ---------------------------------------------------------


def _explain_failure(
    body: bytes, exc: msgspec.ValidationError, revision: int | None
) -> RevisionError:
    """Classify a failed typed decode, naming the exact entry when possible."""
    try:
        obj = msgspec.json.decode(body)
    except msgspec.ValidationError:
        # Valid JSON holding a number no Python float can hold ("1e400"). A
        # newer or malformed schema_version still takes precedence, as always.
        try:
            _check_version(_probe_version(body, revision), revision)
        except RevisionError as refusal:
            return refusal
        # The typed message names the field (the untyped one says only `$[...]`).
        return RevisionError(reasons.VALIDATION, _typed_message(exc), revision=revision)
    except msgspec.DecodeError as untyped:
        return RevisionError(reasons.CORRUPT, f"not JSON: {untyped}", revision=revision)
    except RecursionError:
        return RevisionError(reasons.CORRUPT, "JSON nested too deeply", revision=revision)
    try:
        document_from_object(obj, revision=revision)
    except RevisionError as refusal:
        return refusal
    # The untyped view converts cleanly although the typed decode did not (for
    # example a name repeated within one JSON object, where the last one wins
    # here but the first one failed there): keep msgspec's own message.
    return RevisionError(reasons.VALIDATION, _typed_message(exc), revision=revision)


def _typed_message(exc: msgspec.ValidationError) -> str:
    """msgspec's own message of a typed decode, as ``$.path: why``."""
    return _rebase(_suggest(str(exc), RevisionDocument), "$")


class _VersionProbe(msgspec.Struct):
    schema_version: Any = _MISSING


def _probe_version(body: bytes, revision: int | None) -> object:
    """``schema_version`` alone, the rest skipped; raises a corrupt refusal."""
    try:
        return _PROBE.decode(body).schema_version
    except msgspec.ValidationError:
        return math.inf  # schema_version itself out of range: "not an integer"
    except (msgspec.DecodeError, RecursionError) as exc:
        raise RevisionError(reasons.CORRUPT, f"not JSON: {exc}", revision=revision) from None


_PROBE: Final = msgspec.json.Decoder(_VersionProbe)


def _locate(obj: dict[Any, Any]) -> str | None:
    """``$.path: message`` for the first shape error in ``obj``, or None."""
    top = {k: v for k, v in obj.items() if k not in ("aliases", "keys")}
    problem = _convert_error(top, RevisionDocument, "$")
    if problem is not None:
        return problem
    for section, spec, what in (("aliases", AliasSpec, "alias"), ("keys", KeySpec, "key")):
        if section not in obj:
            continue
        parent = f"$.{section}"
        entries = obj[section]
        if not isinstance(entries, dict):
            return f"{parent}: expected an object, got {_kind(entries)}"
        for name, value in entries.items():
            here = member_path(parent, name)
            if not _NAME.fullmatch(name):
                return f"{here}: not a valid {what} name: {_NAME_RULE}"
            problem = _convert_error(value, spec, here)
            if problem is not None:
                return problem
    return None


def _convert_error(value: object, spec: type[msgspec.Struct], path: str) -> str | None:
    try:
        msgspec.convert(value, spec)
    except msgspec.ValidationError as exc:
        return _rebase(_suggest(str(exc), spec), path)
    return None


_UNKNOWN: Final = re.compile(
    r"Object contains unknown field `(?P<name>.*?)`(?P<at> - at `\$(?P<path>[^`]*)`)?", re.S)


def _suggest(message: str, spec: type[msgspec.Struct]) -> str:
    """msgspec's unknown field, its name shown bounded (:func:`~supervisor.bounds.shown`),
    and when at the top of ``spec``, with the field that was meant."""
    import difflib

    found = _UNKNOWN.fullmatch(message)
    if found is None:
        return message
    name = found["name"]
    close = [] if found["path"] else difflib.get_close_matches(
        name, spec.__struct_fields__, n=1, cutoff=0.6)
    hint = f" (did you mean `{close[0]}`?)" if close else ""
    return f"Object contains unknown field `{shown(name)}`{hint}{found['at'] or ''}"


_AT: Final = re.compile(r"(?P<what>.*) - at `\$(?P<rest>[^`]*)`", re.DOTALL)


def _rebase(message: str, path: str) -> str:
    """msgspec's ``Expected ... - at `$.x``` as ``<path>.x: Expected ...``."""
    found = _AT.fullmatch(message)
    what, where = (found["what"], path + found["rest"]) if found else (message, path)
    return f"{where}: {what}"


_KINDS: Final = ((type(None), "null"), (bool, "a boolean"), (int | float, "a number"),
                 (str, "a string"), (list | tuple, "an array"), (dict, "an object"))


def _kind(value: object) -> str:
    return next((kind for types, kind in _KINDS if isinstance(value, types)),
                type(value).__name__)
