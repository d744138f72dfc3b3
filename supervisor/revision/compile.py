"""Compile a stored revision body into a servable :class:`Snapshot`: :func:`compile_revision`.

Operators: docs/revision-schema.md (the document), docs/reasons.md (the refusals).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from itertools import chain, islice
from operator import attrgetter, eq, methodcaller
from typing import Any, Final, NoReturn, cast

from supervisor import reasons
from supervisor.bounds import PATH_BYTES, quoted, shown
from supervisor.revision.document import KeySpec, RevisionDocument, decode_body, member_path
from supervisor.revision.errors import RevisionError
from supervisor.revision.secrets import EnvFileResolver, SecretResolver
from supervisor.revision.snapshot import KeyEntry, Snapshot

__all__ = ["compile_revision"]


def compile_revision(
    body: bytes,
    *,
    revision: int,
    generation: int,
    resolver: SecretResolver | None = None,
) -> Snapshot:
    """Decode, check, resolve and build: a whole snapshot, or a :class:`RevisionError`.

    The stages run in order and the first refusal wins, so a body's reason is stable:

    1. decode (:func:`~supervisor.revision.document.decode_body`).
    2. projection: every alias a key names is defined, else ``projection`` naming both.
       The detail also counts the other dangling references.
    3. secrets: every key's reference resolves to a non-empty secret, else ``secret``.
       It names the key's ``$.path`` and the reference, never the value.
       A transient shortage reading a secret file is ``unavailable``.
    4. snapshot: no two keys may share one secret (equal digests), else ``snapshot``.
       Clients authenticate by the secret: a shared one makes the key ambiguous.
       So would be the aliases the request may use. Both keys are named, in document order.

    A refused candidate never produces a snapshot, so it can never replace the active one.
    ``resolver`` defaults to an :class:`EnvFileResolver` over the live environment.
    Every refusal is a :class:`RevisionError` carrying ``revision``.

    Pure, synchronous and thread-safe: the caller may run it in a thread for large bodies.
    A secret exists only between ``resolve`` and ``sha256`` (:func:`_resolve_keys`).
    The snapshot adopts the decoded dictionaries instead of copying them.
    Alias specs serve as alias entries; each key spec is replaced in place by its entry.
    So compiling allocates little beyond what decoding built (``bench/bench_compile.py``).
    """
    doc = decode_body(body, revision=revision)
    _check_projection(doc, revision)
    keys = _resolve_keys(doc, EnvFileResolver() if resolver is None else resolver, revision)
    # ``doc`` is local to this call and dropped on return, so the snapshot can
    # adopt its alias dictionary (and the frozen specs in it) without a copy.
    return Snapshot.adopt(revision=revision, generation=generation, aliases=doc.aliases, keys=keys)


def _check_projection(doc: RevisionDocument, revision: int) -> None:
    aliases = doc.aliases
    # One C-level pass answers the common case; only a refusal walks the keys
    # in Python to name the first offender (and count the others).
    referenced = chain.from_iterable(map(_ALIASES_OF, doc.keys.values()))
    if all(map(aliases.__contains__, referenced)):
        return
    dangling = [
        (name, index, alias)
        for name, key in doc.keys.items()
        for index, alias in enumerate(key.aliases)
        if alias not in aliases
    ]
    name, index, alias = dangling[0]
    more = len(dangling) - 1
    tail = f" ({more} more unknown alias reference{'s' if more > 1 else ''})" if more else ""
    raise RevisionError(
        reasons.PROJECTION,
        f"{member_path('$.keys', name)}.aliases[{index}]: key {quoted(name)} names "
        f"unknown alias {quoted(alias)}{tail}",
        revision=revision,
    )


_ALIASES_OF: Final = attrgetter("aliases")
_SECRET_OF: Final = attrgetter("secret")
_DIGEST_OF: Final = attrgetter("digest")
_HEX: Final = methodcaller("hexdigest")
_EMPTY_DIGEST: Final = hashlib.sha256(b"").hexdigest()


def _resolve_keys(
    doc: RevisionDocument, resolver: SecretResolver, revision: int
) -> dict[str, KeyEntry]:
    """Replace each key's spec by its entry, in place, in document order.

    Memory and time are the point: ``doc.keys`` is this compilation's own dictionary.
    Rewriting its values in place frees each spec and its reference once its entry exists,
    and reuses the dictionary itself.
    Each secret lives from ``resolve`` to ``sha256`` inside one chain of C-level ``map`` calls.
    It is never collected in a list.
    The chain pulls one key at a time: resolve, hash, build the entry, store it.
    """
    table = cast(dict[str, Any], doc.keys)  # KeySpec values become KeyEntry values
    names = list(table)
    spec_of = table.__getitem__
    digests = map(
        _HEX, map(hashlib.sha256, map(resolver.resolve, map(_SECRET_OF, map(spec_of, names))))
    )
    try:
        table.update(
            zip(names, map(KeyEntry, digests, map(_ALIASES_OF, map(spec_of, names))), strict=True)
        )
    except MemoryError:
        raise  # the process's problem, not the reference's
    except Exception as exc:  # noqa: BLE001 - a pluggable resolver may raise anything
        # Entries are stored in order, so the failing key is the first one
        # still holding its spec.
        name = next(n for n in names if isinstance(table[n], KeySpec))
        raise _secret_refusal(name, table[name], exc, revision) from None
    entries = cast(dict[str, KeyEntry], table)
    ordered = sorted(map(_DIGEST_OF, entries.values()))
    at = bisect_left(ordered, _EMPTY_DIGEST)
    has_empty = at < len(ordered) and ordered[at] == _EMPTY_DIGEST
    if has_empty or any(map(eq, ordered, islice(ordered, 1, None))):
        _refuse_digests(entries, revision)
    return entries


def _secret_refusal(name: str, spec: KeySpec, exc: Exception, revision: int) -> RevisionError:
    where = f"{member_path('$.keys', name)}.secret"
    if isinstance(exc, RevisionError):
        # Whatever label a pluggable resolver chose, this stage is "secret",
        # except a transient shortage (EMFILE ...): ``unavailable`` is retried
        # with backoff, and at boot falls back to the cache (secrets.py).
        reason = reasons.UNAVAILABLE if exc.reason == reasons.UNAVAILABLE else reasons.SECRET
        return RevisionError(reason, f"{where}: {exc.detail}", revision=revision)
    # The class only, and the caller does not chain: a foreign message (or a
    # traceback) may quote the secret value.
    return RevisionError(
        reasons.SECRET,
        f"{where}: {shown(spec.secret, PATH_BYTES)} could not be resolved "
        f"({type(exc).__name__})",
        revision=revision,
    )


def _refuse_digests(entries: dict[str, KeyEntry], revision: int) -> NoReturn:
    """Name the first empty secret (a ``secret`` refusal) or else the first shared one."""
    for name, entry in entries.items():
        if entry.digest == _EMPTY_DIGEST:
            raise RevisionError(
                reasons.SECRET,
                f"{member_path('$.keys', name)}.secret: resolved to an empty secret",
                revision=revision,
            )
    owner_of: dict[str, str] = {}
    for name, entry in entries.items():
        first = owner_of.setdefault(entry.digest, name)
        if first != name:
            raise RevisionError(
                reasons.SNAPSHOT,
                f"keys {quoted(first)} and {quoted(name)} resolve to the same secret; a request "
                "presenting it could not be attributed to one key",
                revision=revision,
            )
    raise AssertionError("digest check disagreed with itself")  # pragma: no cover
