"""Revision documents, their compilation, and the snapshots they compile to.

- :mod:`.document`: the schema_version 1 document (the rule for an alias's
  upstream URL included), :func:`decode_body` for a stored body;
- :mod:`.files`: :func:`load_document_file` for ``publish`` (TOML or JSON);
- :mod:`.secrets`: secret references (``env:NAME``, ``file:PATH``);
- :mod:`.compile`: :func:`compile_revision`, body -> :class:`Snapshot`, staged
  so each refusal carries one reason label;
- :mod:`.snapshot`: the immutable :class:`Snapshot` (digests, never secrets);
- :mod:`.errors`: :class:`RevisionError`, the one exception for all refusals.
"""

from __future__ import annotations

from supervisor.revision.compile import compile_revision
from supervisor.revision.document import (
    SCHEMA_VERSION,
    AliasSpec,
    KeySpec,
    RevisionDocument,
    decode_body,
    encode_document,
)
from supervisor.revision.errors import RevisionError
from supervisor.revision.files import load_document_file
from supervisor.revision.secrets import EnvFileResolver, SecretResolver
from supervisor.revision.snapshot import AliasEntry, KeyEntry, Snapshot

__all__ = [
    "SCHEMA_VERSION",
    "AliasEntry",
    "AliasSpec",
    "EnvFileResolver",
    "KeyEntry",
    "KeySpec",
    "RevisionDocument",
    "RevisionError",
    "SecretResolver",
    "Snapshot",
    "compile_revision",
    "decode_body",
    "encode_document",
    "load_document_file",
]
