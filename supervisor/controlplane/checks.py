"""The checks both databases run on what they read and write, so they cannot drift.

Also shared: the observe and hydrate statements, and the decoding of stored values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from supervisor.bounds import MAX_SEQUENCE, cut_read
from supervisor.controlplane.errors import (
    ControlPlaneError,
    FailureCategory,
    Incompatible,
    TooLarge,
)
from supervisor.controlplane.migrations import MIGRATIONS_TABLE, Backend, check_not_newer
from supervisor.controlplane.store import RevisionPointer
from supervisor.sinks.state import Candidate

__all__ = ["MESSAGE_BYTES", "as_bytes", "bounded_message", "check_hydrated",
           "check_publishable", "hydrate_sql", "message_columns", "observe_sql", "parse_time",
           "pointer_from_row", "refuse_unreadable"]


def parse_time(value: object) -> datetime | None:
    """A stored time (SQLite: ISO text) as an aware datetime; None when it is not one."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def as_bytes(value: object) -> bytes | None:
    """A stored BLOB as bytes (a plain-SQL publisher on SQLite may have stored TEXT)."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return None


#: A revision's message as read: its first this many bytes, cut and marked (never refused).
MESSAGE_BYTES = 4096


def message_columns(size: Callable[[str], str], head: Callable[[str, int], str]) -> str:
    """The message's head and its size in bytes, bounded in the query itself."""
    return f"{head('r.message', MESSAGE_BYTES)}, {size('r.message')}"


def bounded_message(head: object, size: object) -> str | None:
    """The message as the bounded read returned it: cut to MESSAGE_BYTES and marked."""
    if not isinstance(head, str):
        return None
    return cut_read(head, size if isinstance(size, int) else 0, MESSAGE_BYTES)


def hydrate_sql(size: Callable[[str], str], named: str, created_at: str = "r.created_at") -> str:
    """The hydrate read: ``size`` measures a column in bytes, ``named`` spells a named parameter.

    One statement is one snapshot (PostgreSQL even under READ COMMITTED; SQLite one
    read transaction): the pointer and its revision are read consistently. The SQL
    withholds a body too large or too new, so an oversize body never crosses the
    network. The message is not read: the loop has no use for it.
    """
    body = size("r.body")
    return (f"SELECT d.revision_id, r.id, r.schema_version, {body},"
            f" CASE WHEN {body} <= {named.format('max_bytes')}"
            f" AND r.schema_version <= {named.format('max_schema')} THEN r.body END,"
            f" r.body_sha256, {created_at}, d.sequence"
            " FROM supervisor_desired d"
            " LEFT JOIN supervisor_revisions r ON r.id = d.revision_id WHERE d.singleton")


def observe_sql(schema_readable: bool = True) -> str:
    """The observe read, identical on both stores.

    The pointer, its body's digest, the sequence, and the schema's newest migration
    (NULL where the role may not read the migrations table). So a database migrated
    ahead is refused at the next observe.
    """
    schema = f"(SELECT max(version) FROM {MIGRATIONS_TABLE})" if schema_readable else "NULL"
    return (f"SELECT d.revision_id, r.body_sha256, d.sequence, {schema}"
            " FROM supervisor_desired d LEFT JOIN supervisor_revisions r"
            " ON r.id = d.revision_id WHERE d.singleton")


def pointer_from_row(row: tuple[object, object, object, object] | None, identity: str | None,
                     backend: Backend = "sqlite") -> RevisionPointer | None:
    """The observe row as a pointer; TypeError (-> ``malformed``) for an impossible pointer,
    SchemaTooNew for a schema a newer build migrated."""
    if row is None:
        return None
    revision, digest, sequence, schema = row
    check_not_newer(schema if isinstance(schema, int) else None, backend)
    if not isinstance(revision, int) or revision < 1:
        raise TypeError(f"the desired pointer holds {revision!r}, not a revision id "
                        "(ids are >= 1)")
    body_sha256 = as_bytes(digest)
    if digest is not None and body_sha256 is None:
        raise TypeError(f"body_sha256 holds {type(digest).__name__}, not bytes")
    return RevisionPointer(revision, body_sha256, identity, _sequence(sequence))


def _sequence(value: object) -> int:
    """A change count a signed statement can carry (at most 2^62); TypeError otherwise."""
    if (not isinstance(value, int) or isinstance(value, bool)
            or not 0 <= value <= MAX_SEQUENCE):
        raise TypeError(f"supervisor_desired.sequence holds {value!r}, not a change count "
                        f"(0..{MAX_SEQUENCE})")
    return value


def check_hydrated(row: Sequence[Any], *, max_revision_bytes: int,
                   max_schema_version: int) -> Candidate:
    """The hydrate row as a Candidate, or the first check it fails; blocking (hashes the body).

    ``row`` is what :func:`hydrate_sql` selects: the desired id, the revision's id,
    ``schema_version``, size, body (None when the query withheld it: too large or too
    new), ``body_sha256``, ``created_at`` and the sequence. The order, all before the
    body is decoded:

    * the pointer names a missing revision (NOT_FOUND);
    * the body is over ``max_revision_bytes`` (TooLarge);
    * its ``schema_version`` is newer than the build reads (Incompatible);
    * its SHA-256 differs from ``body_sha256`` (CORRUPT).

    The query withholds the body in the first three cases. The body stays bytes:
    decoding is the revision compiler's job.
    """
    desired, rid, schema_version, size, body, digest, created_at, sequence = row
    body, digest = as_bytes(body), as_bytes(digest)
    if not isinstance(desired, int) or desired < 1:
        # The schema says NOT NULL, and identity columns start at 1; only a
        # hand-edited table gets here.
        raise ControlPlaneError(
            f"the desired pointer holds {desired!r}, not a revision id (ids are >= 1)",
            category=FailureCategory.CORRUPT)
    if rid is None:
        raise ControlPlaneError(f"desired points at revision {desired}, which does not exist",
                                category=FailureCategory.NOT_FOUND, revision=desired)
    schema_version = schema_version if schema_version is not None else 0
    refuse_unreadable(rid, size or 0, schema_version,
                      max_revision_bytes=max_revision_bytes, max_schema_version=max_schema_version)
    if body is None or parse_time(created_at) is None or schema_version < 1:
        raise ControlPlaneError(
            f"revision {rid} is incomplete (missing body, created_at or schema_version)",
            category=FailureCategory.CORRUPT, revision=rid)
    if digest is None or hashlib.sha256(body).digest() != digest:
        raise ControlPlaneError(f"revision {rid}: body does not match body_sha256",
                                category=FailureCategory.CORRUPT, revision=rid)
    return Candidate(id=rid, body_sha256=digest, body=body, schema_version=schema_version,
                     sequence=None if sequence is None else _sequence(sequence))


def check_publishable(body: bytes, schema_version: int, *, max_revision_bytes: int,
                      max_schema_version: int) -> None:
    """Refuse, before anything is stored, what no replica of this build could hydrate."""
    refuse_unreadable(None, len(body), schema_version,
                      max_revision_bytes=max_revision_bytes, max_schema_version=max_schema_version)
    if schema_version < 1:
        raise ControlPlaneError(f"schema_version must be >= 1, got {schema_version}",
                                category=FailureCategory.INVALID)


def refuse_unreadable(revision: int | None, size: int, schema_version: int, *,
                      max_revision_bytes: int, max_schema_version: int) -> None:
    """TooLarge for a body over the bound, else Incompatible for a schema this build cannot read.

    A follower applies it to an upstream's statement too.
    """
    if size > max_revision_bytes:
        raise TooLarge(revision, size, max_revision_bytes)
    if schema_version > max_schema_version:
        raise Incompatible(revision, schema_version, max_schema_version)
