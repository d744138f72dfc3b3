"""The signed last-known-good cache, and the Ed25519 keys that sign it.

:class:`LastKnownGood` (:mod:`~supervisor.sinks.lkg.cache`) is the entry point.
Each submodule owns one concern and says which in its first line.
Every public name is importable from here.
"""

from __future__ import annotations

from supervisor.sinks.lkg.cache import SERVED_SUFFIX, CachedRevision, LastKnownGood
from supervisor.sinks.lkg.errors import (
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
