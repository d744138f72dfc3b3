"""Large revision bodies and the failure count a replica reports."""

from __future__ import annotations

import json

import httpx


def big_body(target_bytes: int) -> bytes:
    per_alias = len(json.dumps({"a000000": {"upstream": "https://a000000.internal.example/v1",
                                            "timeout_s": 30, "retries": 2}}))
    count = target_bytes // per_alias
    doc = {
        "schema_version": 1,
        "aliases": {f"a{i:06d}": {"upstream": f"https://a{i:06d}.internal.example/v1",
                                  "timeout_s": 30, "retries": 2} for i in range(count)},
        "keys": {"team": {"secret": "env:TSUP_TEST_NEVER_SET", "aliases": ["a000000"]}},
    }
    return json.dumps(doc).encode()


def costly_body(target_bytes: int) -> bytes:
    """A revision of about ``target_bytes`` with the most aliases per byte (the longest
    compile a byte), refused for a secret that is never set once it is compiled."""
    alias = {"upstream": "https://x.io"}
    per_alias = len(json.dumps({"a0000000": alias}, separators=(",", ":")))
    doc = {
        "schema_version": 1,
        "aliases": {f"a{i:07x}": alias for i in range(target_bytes // per_alias)},
        "keys": {"team": {"secret": "env:TSUP_TEST_NEVER_SET", "aliases": ["a0000000"]}},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


async def failures(port: int) -> int:
    async with httpx.AsyncClient(timeout=10.0) as client:
        report = (await client.get(f"http://127.0.0.1:{port}/status")).json()
    return int(report["revision"]["consecutive_failures"])
