"""The signed last-known-good cache, and the Ed25519 keys that sign it.

Split by concern:

- :mod:`~supervisor.sinks.lkg.errors`: the refusals (``CacheError`` and its labels) and
  the key file's errors;
- :mod:`~supervisor.sinks.lkg.keys`: key texts, key ids, the signing key file, ``keygen``;
- :mod:`~supervisor.sinks.lkg.fileformat`: the signed file format and its verification;
- :mod:`~supervisor.sinks.lkg.mark`: the served-revision mark file and the rollback
  refusal it makes possible;
- :mod:`~supervisor.sinks.lkg.cache`: :class:`LastKnownGood` (export, load, and the
  order of the cache's and the mark's writes that keeps rollback protection);
- :mod:`~supervisor.sinks.lkg.statement`: the signed statement (format_version 2);
- :mod:`~supervisor.sinks.lkg.accepted`: a follower's highest accepted statement;
- :mod:`~supervisor.sinks.lkg.files`: the cache's files on disk, and one daemon per cache.

Every public name is importable from here.
"""

from __future__ import annotations

from supervisor.sinks.lkg.cache import SERVED_SUFFIX, CachedRevision, LastKnownGood
from supervisor.sinks.lkg.errors import (
    ROLLBACK,
    UNWRITABLE,
    CacheError,
    CacheReason,
    CacheSkew,
    CacheUnwritable,
    KeyFileError,
    KeyFileExists,
)
from supervisor.sinks.lkg.fileformat import (
    FIRST_FORMAT_VERSION,
    FORMAT_VERSION,
    MAGIC,
    MAX_HEADER_BYTES,
    SIGNATURE_BYTES,
    encode_file,
    encode_header,
)
from supervisor.sinks.lkg.keys import (
    KEY_BYTES,
    KEY_ID_HEX_DIGITS,
    SIGNING_KEY_PREFIX,
    VERIFY_KEY_PREFIX,
    format_verify_key,
    generate_signing_key,
    key_id_of,
    load_signing_key,
    parse_verify_key,
)
from supervisor.sinks.lkg.statement import Statement

__all__ = [
    "FIRST_FORMAT_VERSION",
    "FORMAT_VERSION",
    "KEY_BYTES",
    "KEY_ID_HEX_DIGITS",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "ROLLBACK",
    "SERVED_SUFFIX",
    "SIGNATURE_BYTES",
    "SIGNING_KEY_PREFIX",
    "UNWRITABLE",
    "VERIFY_KEY_PREFIX",
    "CacheError",
    "CacheReason",
    "CacheSkew",
    "CacheUnwritable",
    "CachedRevision",
    "KeyFileError",
    "KeyFileExists",
    "LastKnownGood",
    "Statement",
    "encode_file",
    "encode_header",
    "format_verify_key",
    "generate_signing_key",
    "key_id_of",
    "load_signing_key",
    "parse_verify_key",
]
