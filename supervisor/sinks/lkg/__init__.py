"""The signed last-known-good cache, and the Ed25519 keys that sign it.

:class:`LastKnownGood` (:mod:`~supervisor.sinks.lkg.cache`) is the entry point.
Each submodule owns one concern and says which in its first line.
The names other modules use are importable from here.
"""

from __future__ import annotations

from supervisor.sinks.lkg.cache import LastKnownGood
from supervisor.sinks.lkg.errors import (
    CacheError,
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
    encode_file,
    encode_header,
)
from supervisor.sinks.lkg.keys import (
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
    "MAGIC",
    "MAX_HEADER_BYTES",
    "CacheError",
    "CacheSkew",
    "CacheUnwritable",
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
