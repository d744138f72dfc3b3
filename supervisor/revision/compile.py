"""Compile a stored revision body into a servable :class:`Snapshot`.

Contract (CONTRACT.md section 5): compilation runs these stages in order and
the first refusal wins, so a body's reason label is stable whatever else is
wrong with it:

1. decode (:func:`~supervisor.revision.document.decode_body`): ``corrupt``,
   ``incompatible``, or ``validation`` with the ``$.path``;
2. projection: every alias a key names must be defined, else ``projection``
   naming the key and the alias (and how many other dangling references exist);
3. secrets: every key's reference resolves to a non-empty secret, else
   ``secret`` naming the key's ``$.path`` and the reference, never the value;
4. snapshot: the build itself. Rule: no two keys may share one secret (equal
   digests). Clients authenticate by presenting the secret; a shared secret
   would make the key, and so the aliases the request may use, ambiguous.
   Refused as ``snapshot``, naming both keys (in document order).

A refused candidate never produces a snapshot, so it can never replace the
active one: this function either returns a whole snapshot or raises
:class:`RevisionError`.

Pure, synchronous and thread-safe (no shared mutable state), so the caller may
run it in ``trio.to_thread.run_sync`` for large bodies. Secrets live only in a
local variable long enough to be hashed; the snapshot holds their SHA-256 hex
digests. The decoded alias specs are reused as the snapshot's alias entries and
the decoded dictionary is adopted, not copied: compilation allocates one
digest and one key entry per key beyond what decoding already built.
"""

from __future__ import annotations

import hashlib
from itertools import chain

from supervisor import reasons
from supervisor.revision.document import RevisionDocument, decode_body, member_path
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
    """Decode, check, resolve and build; see the module docstring for the stages.

    ``resolver`` defaults to an :class:`EnvFileResolver` over the live
    environment. Every refusal is a :class:`RevisionError` carrying ``revision``.
    """
    doc = decode_body(body, revision=revision)
    _check_projection(doc, revision)
    keys = _resolve_keys(doc, resolver or EnvFileResolver(), revision)
    # ``doc`` is local to this call and dropped on return, so the snapshot can
    # adopt its alias dictionary (and the frozen specs in it) without a copy.
    return Snapshot.adopt(revision=revision, generation=generation, aliases=doc.aliases, keys=keys)


def _check_projection(doc: RevisionDocument, revision: int) -> None:
    aliases = doc.aliases
    # One set operation in C answers the common case; only a refusal walks
    # the keys in Python to name the first offender.
    referenced = set(chain.from_iterable(key.aliases for key in doc.keys.values()))
    if referenced <= aliases.keys():
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
        f"{member_path('$.keys', name)}.aliases[{index}]: key {name!r} names "
        f"unknown alias {alias!r}{tail}",
        revision=revision,
    )


def _resolve_keys(
    doc: RevisionDocument, resolver: SecretResolver, revision: int
) -> dict[str, KeyEntry]:
    resolve = resolver.resolve
    sha256 = hashlib.sha256
    entries: dict[str, KeyEntry] = {}
    owner_of: dict[str, str] = {}  # digest -> first key holding it
    shared: tuple[str, str] | None = None
    for name, key in doc.keys.items():
        try:
            secret = resolve(key.secret)
        except RevisionError as exc:
            # Whatever label a pluggable resolver chose, this stage is "secret".
            raise RevisionError(
                reasons.SECRET, f"{_secret_path(name)}: {exc.detail}", revision=revision
            ) from None
        except MemoryError:
            raise  # the process's problem, not the reference's
        except Exception as exc:  # noqa: BLE001 - a pluggable resolver may raise anything
            # Its class only: a foreign message may quote the value. Not
            # chained for the same reason (a traceback would print it).
            raise RevisionError(
                reasons.SECRET,
                f"{_secret_path(name)}: {key.secret} could not be resolved ({type(exc).__name__})",
                revision=revision,
            ) from None
        if not isinstance(secret, bytes) or not secret:
            raise RevisionError(
                reasons.SECRET,
                f"{_secret_path(name)}: resolved to an empty secret",
                revision=revision,
            )
        digest = sha256(secret).hexdigest()
        del secret  # nothing below needs it; the digest is all the snapshot keeps
        first = owner_of.setdefault(digest, name)
        if first != name and shared is None:
            # Remember, don't raise: a secret refusal on a later key outranks
            # this one (stage order), so finish resolving first.
            shared = (first, name)
        entries[name] = KeyEntry(digest=digest, aliases=key.aliases)
    if shared is not None:
        first, second = shared
        raise RevisionError(
            reasons.SNAPSHOT,
            f"keys {first!r} and {second!r} resolve to the same secret; a request "
            "presenting it could not be attributed to one key",
            revision=revision,
        )
    return entries


def _secret_path(name: str) -> str:
    return f"{member_path('$.keys', name)}.secret"
