"""The cache file's format: framing, the signed header, and verification.

The layout is on :func:`encode_file`; the checks and their order on :func:`decode_file`.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Final, NoReturn, TypeVar

import msgspec
import nacl.exceptions
import nacl.signing

from supervisor import reasons
from supervisor.bounds import MAX_SEQUENCE, OutOfRange
from supervisor.sinks.lkg.errors import CacheError, CacheSkew
from supervisor.sinks.lkg.keys import KEY_ID_HEX_DIGITS
from supervisor.sinks.lkg.statement import Statement, utc_times

__all__ = [
    "FIRST_FORMAT_VERSION",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "SIGNATURE_BYTES",
    "Header",
    "decode_file",
    "encode_file",
    "encode_header",
    "peek_header",
    "peek_revision",
]

MAGIC: Final = b"TRIO-SUPERVISOR-LKG\n"
FORMAT_VERSION: Final = 2
#: The oldest version this build reads (no statement fields).
FIRST_FORMAT_VERSION: Final = 1
MAX_HEADER_BYTES: Final = 64 * 1024
SIGNATURE_BYTES: Final = 64
_LENGTH: Final = struct.Struct(">I")
_Peeked = TypeVar("_Peeked")

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]
_Sha256Hex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
_KeyId = Annotated[str, msgspec.Meta(pattern=f"^[0-9a-f]{{{KEY_ID_HEX_DIGITS}}}$")]


_Root = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class Header(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """The signed header; field order is the on-disk order.

    Version 1 has the first eight fields; version 2 adds the last four, the signed
    statement (:mod:`~supervisor.sinks.lkg.statement`). Without a statement a writer
    still writes version 1. ``created_at``, ``issued_at`` and ``expires_at`` are
    RFC 3339 in UTC. ``key_id`` names the signing key (:func:`~.keys.key_id_of`).
    """

    format_version: int
    revision: _NonNegative  # the control-plane revision id (>= 1 when written)
    generation: _NonNegative  # the snapshot generation it was published as
    schema_version: _NonNegative  # the revision document's
    created_at: datetime
    body_length: _NonNegative
    body_sha256: _Sha256Hex  # lowercase hex
    key_id: _KeyId
    sequence: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQUENCE)] | None = None
    root: _Root | None = None
    issued_at: datetime | None = None
    expires_at: datetime | None = None

    def statement(self, signed: bytes | None = None) -> Statement | None:
        """The signed statement of a version 2 header (None for version 1)."""
        if (self.sequence is None or self.root is None or self.issued_at is None
                or self.expires_at is None):
            return None
        return Statement(self.revision, self.body_sha256, self.sequence, self.root,
                         self.issued_at, self.expires_at, signed)


class _Envelope(msgspec.Struct):
    """The two fields every format version keeps, read before the signature is checked.

    Lenient on purpose: unknown fields are ignored, key_id may be any type. So a newer
    format's header still yields its version and key, and shows as skew, not corruption.
    """

    format_version: int
    key_id: Any = None


def encode_header(
    *,
    revision: int,
    generation: int,
    schema_version: int,
    created_at: datetime,
    body: bytes,
    key_id: str,
    statement: Statement | None = None,
    format_version: int | None = None,
    body_sha256: str | None = None,
) -> bytes:
    """The header bytes for ``body``: version 2 with ``statement``, else version 1.

    ``body_sha256`` (hex) is the body's digest where the caller verified it already. A body
    is hashed once on its way from the control plane to the cache.
    """
    if format_version is None:
        format_version = FIRST_FORMAT_VERSION if statement is None else FORMAT_VERSION
    extra: dict[str, Any] = {}
    if statement is not None:
        extra = {"sequence": statement.sequence, "root": statement.root,
                 "issued_at": _utc(statement.issued_at),
                 "expires_at": _utc(statement.expires_at)}
    header = Header(
        format_version=format_version,
        revision=revision,
        generation=generation,
        schema_version=schema_version,
        created_at=_utc(created_at),
        body_length=len(body),
        body_sha256=body_sha256 or hashlib.sha256(body).hexdigest(),
        key_id=key_id,
        **extra,
    )
    return msgspec.json.encode(header)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:  # a naive clock is taken to be UTC
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def encode_file(header: bytes, body: bytes, signing_key: nacl.signing.SigningKey) -> bytes:
    """Frame and sign: magic, header length, header, signature, body.

    Layout (format_version 2; version 1 still loads). Integers are big-endian::

        magic       20 bytes   b"TRIO-SUPERVISOR-LKG\\n"
        header_len   4 bytes   unsigned; at most 65536
        header      header_len bytes: msgspec JSON, the fields of :class:`Header` in order
        signature   64 bytes   Ed25519 detached signature over magic + header_len + header
        body        body_length bytes: the revision document as the control plane stored it

    The signature covers every byte before it. The body is covered through the
    signed ``body_length`` and ``body_sha256``. Truncation anywhere shows in the
    length prefix, the fixed signature size or ``body_length``. The framing is the
    same for every format version; a format that must change it changes the magic.
    """
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    signed = MAGIC + _LENGTH.pack(len(header)) + header
    return signed + signing_key.sign(signed).signature + body


def _shown(value: object) -> str:
    # Values from an unauthenticated file: bounded, repr-escaped, before they
    # reach a log line.
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def decode_file(
    data: bytes, path: str, trusted: Mapping[str, nacl.signing.VerifyKey]
) -> tuple[Header, bytes]:
    """Verify and split a cache file; raises CacheError.

    Checks in order: framing (``corrupt``), authenticity (``denied``), the format
    version (:class:`CacheSkew`), then the header fields and the body they vouch
    for (``corrupt``). What each label means: LastKnownGood.load.
    """

    def corrupt(detail: str, revision: int | None = None) -> NoReturn:
        raise CacheError(reasons.CORRUPT, path, detail, revision=revision)

    def denied(detail: str) -> NoReturn:
        raise CacheError(reasons.DENIED, path, detail)

    # 1. Framing: everything here is unauthenticated, so only lengths are read.
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            corrupt(f"truncated to {len(data)} bytes, inside the magic")
        corrupt("not a last-known-good cache file (bad magic)")
    at = len(MAGIC)
    if len(data) < at + _LENGTH.size:
        corrupt("truncated inside the header length")
    (header_len,) = _LENGTH.unpack_from(data, at)
    if header_len > MAX_HEADER_BYTES:
        corrupt(f"header length {header_len} exceeds {MAX_HEADER_BYTES}")
    header_start = at + _LENGTH.size
    header_end = header_start + header_len
    signature_end = header_end + SIGNATURE_BYTES
    if len(data) < header_end:
        corrupt("truncated inside the header")
    if len(data) < signature_end:
        corrupt("truncated inside the signature")
    signed = data[:header_end]
    header_bytes = data[header_start:header_end]
    signature = data[header_end:signature_end]
    body = data[signature_end:]

    # 2. Authenticity, before any header field is believed.
    try:
        envelope: _Envelope | None = msgspec.json.decode(header_bytes, type=_Envelope)
    except msgspec.DecodeError:  # ValidationError is a DecodeError
        envelope = None
    named = envelope.key_id if envelope is not None else None
    if isinstance(named, str):
        key = trusted.get(named)
        if key is None:
            denied(f"signed by key id {_shown(named)}, which is not in cache.trusted_keys")
        candidates = [(named, key)]
    else:
        # Undecodable header: try every trusted key (a keyring is a handful),
        # so that an altered header reads as "denied" whatever byte changed.
        candidates = list(trusted.items())
    signer = None
    for key_id, key in candidates:
        try:
            key.verify(signed, signature)
        except nacl.exceptions.BadSignatureError:
            continue
        signer = key_id
        break
    if signer is None:
        denied("the signature does not verify (the file was altered, or signed by another key)")
    if envelope is None:
        corrupt("the header is authentic but malformed")

    # 3. The format version, now that it is known to be the signer's.
    if envelope.format_version > FORMAT_VERSION:
        raise CacheSkew(
            path,
            f"format_version {envelope.format_version} is newer than this build reads "
            f"({FORMAT_VERSION}); written by a newer build",
            format_version=envelope.format_version,
        )
    if envelope.format_version < FIRST_FORMAT_VERSION:
        corrupt(f"format_version {envelope.format_version} was never written by any build")

    # 4. The fields, and the body they vouch for.
    try:
        header = msgspec.json.decode(header_bytes, type=Header)
    except msgspec.DecodeError as exc:
        corrupt(f"the header is authentic but malformed: {exc}")
    if header.key_id != signer or header.created_at.tzinfo is None:
        corrupt("the header is authentic but inconsistent", header.revision)
    v2_fields = (header.sequence, header.root, header.issued_at, header.expires_at)
    if header.format_version >= 2 and any(value is None for value in v2_fields):
        corrupt("the version 2 header is authentic but lacks its statement fields",
                header.revision)
    if header.format_version < 2 and any(value is not None for value in v2_fields):
        corrupt("the version 1 header is authentic but carries statement fields",
                header.revision)
    if any(moment is not None and moment.tzinfo is None
           for moment in (header.issued_at, header.expires_at)):
        corrupt("the header is authentic but its times have no time zone", header.revision)
    try:
        created_at = header.created_at.astimezone(UTC)
        if header.issued_at is not None and header.expires_at is not None:
            issued_at, expires_at = utc_times(header.issued_at, header.expires_at)
            header = msgspec.structs.replace(header, issued_at=issued_at, expires_at=expires_at)
        header = msgspec.structs.replace(header, created_at=created_at)
    except (OutOfRange, OverflowError) as exc:
        corrupt(f"the header is authentic but its times are out of range: {exc}",
                header.revision)
    if len(body) != header.body_length:
        corrupt(
            f"the body is {len(body)} bytes but the signed header says {header.body_length} "
            f"(truncated or appended to)",
            header.revision,
        )
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), header.body_sha256):
        corrupt("the body's SHA-256 does not match the signed header", header.revision)
    return header, body


class _RevisionPeek(msgspec.Struct):
    revision: Any = None
    body_sha256: Any = None


def peek_header(prefix: bytes, kind: type[_Peeked]) -> _Peeked | None:
    """The header decoded as ``kind`` from the first bytes of a file, UNVERIFIED; None if
    unreadable.

    For decisions that never serve on their own (pick, remove or report a file):
    nothing here is authenticated. ``prefix`` needs only the magic, the length
    and the header.
    """
    start = len(MAGIC) + _LENGTH.size
    if not prefix.startswith(MAGIC) or len(prefix) < start:
        return None
    (header_len,) = _LENGTH.unpack_from(prefix, len(MAGIC))
    if header_len > MAX_HEADER_BYTES or len(prefix) < start + header_len:
        return None
    try:
        return msgspec.json.decode(prefix[start : start + header_len], type=kind)
    except msgspec.DecodeError:
        return None


def peek_revision(prefix: bytes) -> int | None:
    """The header's ``revision`` (:func:`peek_header`), a non-negative integer or None."""
    peeked = peek_header(prefix, _RevisionPeek)
    value = None if peeked is None else peeked.revision
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def peek_digest(prefix: bytes) -> str | None:
    """The header's ``body_sha256`` (:func:`peek_header`): its text, or None."""
    peeked = peek_header(prefix, _RevisionPeek)
    value = None if peeked is None else peeked.body_sha256
    return value if isinstance(value, str) else None
