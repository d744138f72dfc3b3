"""Revision documents (:mod:`.document`, :mod:`.files`), their compilation
(:mod:`.compile`, :mod:`.secrets`), and the :class:`Snapshot` they compile to
(:mod:`.snapshot`); every refusal is a :class:`RevisionError` (:mod:`.errors`).
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
