"""A revision signed as a replica's ``/v1/revision`` serves it, for the follower's tests."""

from __future__ import annotations

from datetime import UTC, datetime

import nacl.signing

from supervisor.sinks.lkg import encode_file, encode_header, key_id_of

BODY = b'{"schema_version": 1, "aliases": {"a": {"upstream": "https://a.example/"}}}'


KEY = nacl.signing.SigningKey.generate()


def signed(revision: int, body: bytes = BODY, key: nacl.signing.SigningKey = KEY,
           schema_version: int = 1) -> bytes:
    header = encode_header(revision=revision, generation=1, schema_version=schema_version,
                           created_at=datetime.now(UTC), body=body,
                           key_id=key_id_of(key.verify_key))
    return encode_file(header, body, key)
