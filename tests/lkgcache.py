"""A signed cache on real files for the cache's tests.

A fresh instance on the same files (what the next boot builds), an export,
the served mark's text.
"""

from __future__ import annotations

from pathlib import Path

from supervisor.sinks.lkg import LastKnownGood
from supervisor.sinks.lkg.files import CacheFiles

BODY = b'{"schema_version": 1, "aliases": {}}'


def make(cache_path: str, signer: tuple[str, str], files: CacheFiles | None = None) -> LastKnownGood:
    """A fresh instance on the same files: what the next boot (or a restarted child) builds."""
    return LastKnownGood(cache_path, signing_key_path=signer[0], trusted_keys=[signer[1]],
                         max_schema_version=1, files=files)


def export(cache: LastKnownGood, revision: int) -> None:
    cache.export(revision=revision, generation=1, schema_version=1, body=BODY)


def mark_of(cache_path: str) -> str | None:
    try:
        return Path(cache_path + ".served").read_text()
    except FileNotFoundError:
        return None
