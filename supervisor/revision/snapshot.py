"""The compiled, immutable form of a revision, what the daemon serves: :class:`Snapshot`.

Operators: docs/admin-api.md (``GET /v1/snapshot``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, NoReturn

import msgspec

from supervisor.revision.document import AliasSpec

__all__ = ["AliasEntry", "KeyEntry", "Snapshot"]

AliasEntry = AliasSpec
"""A snapshot's alias entry (``upstream``, ``timeout_s``, ``retries``): the decoded spec itself."""


class KeyEntry(msgspec.Struct, frozen=True, gc=False):
    """A snapshot's key entry: the secret's SHA-256 hex digest and the key's aliases."""

    digest: str
    aliases: tuple[str, ...]


_ENCODER: Final = msgspec.json.Encoder()


class Snapshot:
    """An immutable compiled revision; :func:`.compile.compile_revision` builds one.

    It names its ``revision`` (the control-plane id) and ``generation`` (this replica's
    publish count), its aliases, and its keys. Each key is its secret's SHA-256 hex digest
    plus the aliases it may use; it never holds a secret.

    Immutability makes publishing a single reference swap safe: readers keep theirs.
    Attributes cannot be set or deleted, the mappings are read-only views,
    and the entries are frozen Structs holding tuples.
    So a snapshot is shared between threads and trio tasks without locks.
    """

    __slots__ = ("_alias_dict", "_aliases", "_generation", "_key_dict", "_keys", "_revision")

    _revision: int
    _generation: int
    _alias_dict: dict[str, AliasEntry]
    _key_dict: dict[str, KeyEntry]
    _aliases: Mapping[str, AliasEntry]
    _keys: Mapping[str, KeyEntry]

    def __init__(
        self,
        *,
        revision: int,
        generation: int,
        aliases: Mapping[str, AliasEntry],
        keys: Mapping[str, KeyEntry],
    ) -> None:
        # Copies: the caller may keep and mutate the mappings it passed.
        self._init(revision, generation, dict(aliases), dict(keys))

    @classmethod
    def adopt(
        cls,
        *,
        revision: int,
        generation: int,
        aliases: dict[str, AliasEntry],
        keys: dict[str, KeyEntry],
    ) -> Snapshot:
        """Build a snapshot that takes ownership of ``aliases`` and ``keys``, uncopied.

        For the compiler, which builds the dictionaries and drops every other
        reference to them; copying 100,000 entries would cost time and memory
        for nothing. A caller that keeps a reference breaks immutability.
        """
        snapshot = cls.__new__(cls)
        snapshot._init(revision, generation, aliases, keys)
        return snapshot

    def _init(
        self,
        revision: int,
        generation: int,
        aliases: dict[str, AliasEntry],
        keys: dict[str, KeyEntry],
    ) -> None:
        setter = object.__setattr__
        setter(self, "_revision", revision)
        setter(self, "_generation", generation)
        setter(self, "_alias_dict", aliases)
        setter(self, "_key_dict", keys)
        setter(self, "_aliases", MappingProxyType(aliases))
        setter(self, "_keys", MappingProxyType(keys))

    # Read-only properties: a type checker flags an assignment, and so does
    # ``__setattr__`` at run time.
    @property
    def revision(self) -> int:
        """The control-plane revision id this snapshot was compiled from."""
        return self._revision

    @property
    def generation(self) -> int:
        """How many snapshots this replica had published, this one included."""
        return self._generation

    @property
    def aliases(self) -> Mapping[str, AliasEntry]:
        """Alias name -> entry (``upstream``, ``timeout_s``, ``retries``); read-only."""
        return self._aliases

    @property
    def keys(self) -> Mapping[str, KeyEntry]:
        """Key name -> entry (``digest``, ``aliases``); read-only."""
        return self._keys

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"Snapshot is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Snapshot is immutable; cannot delete {name!r}")

    def to_json(self) -> bytes:
        """``{"revision", "generation", "aliases", "keys"}`` as UTF-8 JSON.

        The body of ``GET /v1/snapshot`` and of the ``[snapshot].path`` file::

            {"revision": 7, "generation": 3,
             "aliases": {"chat": {"upstream": "https://...", "timeout_s": 30.0, "retries": 2}},
             "keys": {"team-a": {"digest": "<sha256 hex>", "aliases": ["chat"]}}}
        """
        return _ENCODER.encode(
            {
                "revision": self.revision,
                "generation": self.generation,
                "aliases": self._alias_dict,
                "keys": self._key_dict,
            }
        )

    def etag(self) -> str:
        """The HTTP entity tag, quotes included: ``"<revision>-<generation>"``."""
        return f'"{self.revision}-{self.generation}"'

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshot):
            return NotImplemented
        return (
            self.revision == other.revision
            and self.generation == other.generation
            and self._alias_dict == other._alias_dict
            and self._key_dict == other._key_dict
        )

    def __hash__(self) -> int:
        return hash((self.revision, self.generation))

    def __repr__(self) -> str:
        # Counts, not contents: a snapshot may hold 100,000 entries.
        return (
            f"Snapshot(revision={self.revision}, generation={self.generation}, "
            f"aliases={len(self._alias_dict)}, keys={len(self._key_dict)})"
        )
