"""The signed last-known-good cache, and the Ed25519 keys that sign it.

What it is for
--------------
A replica writes every revision it publishes to a local file (:meth:`LastKnownGood.export`).
When it boots and the control plane is unreachable, or holds a revision this
build cannot read, it may serve that file instead (:meth:`LastKnownGood.load`).
The cache is a *statement by this deployment* ("revision N was good"), so it is
signed, and it is refused rather than served whenever it cannot be trusted.
It is never expired by age (an outage is exactly when it is needed):
:attr:`CachedRevision.age_s` reports the age so the caller can show it.

File format (format_version 1)
------------------------------
All integers big-endian; offsets from the start of the file::

    magic       20 bytes   b"TRIO-SUPERVISOR-LKG\\n"
    header_len   4 bytes   unsigned; at most 65536
    header      header_len bytes: msgspec JSON object, fields in this order:
                  format_version  int     1
                  revision        int     control-plane revision id (>= 0)
                  generation      int     the snapshot generation it was published as
                  schema_version  int     the revision document's schema_version
                  created_at      string  RFC 3339, UTC ("...Z")
                  body_length     int     length of the body in bytes
                  body_sha256     string  lowercase hex SHA-256 of the body
                  key_id          string  id of the signing key (below)
    signature   64 bytes   Ed25519 detached signature over magic + header_len + header
    body        body_length bytes: the revision document as the control plane stored it

The signature covers every byte before it, so the header, its length prefix
and the magic cannot be altered without detection; the body is covered through
the signed ``body_length`` and ``body_sha256``. Truncation anywhere is caught
by the length prefix, the fixed signature size, or ``body_length``. The framing
(magic, length prefix, 64-byte signature, body) is fixed for every format
version; a future format that must change it changes the magic instead.

Keys
----
Verify key text (``[cache].trusted_keys`` entries, and what ``keygen`` prints):
``ed25519:<standard base64 of the 32 key bytes>``. Signing key file (what
:func:`generate_signing_key` writes, mode 0600):
``ed25519-secret:<standard base64 of the 32-byte seed>`` and a newline. A key id is
the first 16 hex digits of the SHA-256 of the 32 verify-key bytes. Several
trusted keys may be listed at once, which is how a key is rotated: trust the
new key everywhere, then switch the signing key, then drop the old one.

Refusals (``CacheError.reason``), checked in this order
--------------------------------------------------------
``corrupt``
    Unreadable file, bad magic, truncation, a header length over the limit, a
    validly signed header that is malformed, or a body whose length or SHA-256
    differs from the signed header. A body digest mismatch is ``corrupt`` and
    not ``denied`` on purpose: the signed statement itself is authentic, the
    bytes it vouches for are not those bytes (bit rot or tampering look the
    same), exactly the control plane's ``corrupt`` (CONTRACT.md section 4).
``denied``
    The header names a key id not in ``trusted_keys``, or the signature does
    not verify (any altered header byte ends here). When the header is not even
    decodable, every trusted key is tried: no match is ``denied``, a match
    means an authentic but malformed header, ``corrupt``.
``incompatible``
    As :class:`CacheSkew` when the (authentic) ``format_version`` is newer
    than this build reads: the caller reports it and treats it as no cache. As
    plain :class:`CacheError` when ``schema_version`` is above
    ``max_schema_version``.
``rollback``
    ``revision`` is below this replica's served-revision mark.
``unwritable``
    Only from :meth:`~LastKnownGood.export` and :meth:`~LastKnownGood.note_served`
    (:class:`CacheUnwritable`, the ``OSError`` chained).

Rollback protection
-------------------
``<path>.served`` holds one decimal revision id, written atomically (0600): the
served-revision mark. :meth:`~LastKnownGood.note_served` raises it;
:meth:`~LastKnownGood.export` sets it to the exported revision, which is what
this replica serves from then on. ``export`` *sets* rather than only raises
because an operator may point desired state back at an older revision id; a
mark that only rose would then make the replica refuse its own, current cache
at the next boot, during an outage, when it is needed. Writes are ordered so
that a crash between the two files never leaves the mark above the cache: when
the mark rises the cache is written first, when it falls the mark is. A missing
mark file is mark 0; a garbled one makes :meth:`~LastKnownGood.load` refuse
(``corrupt``, naming the ``.served`` file: delete it to reset) rather than
silently dropping the protection.

Errors::

    SupervisorError
    ├── CacheError         reason: corrupt | denied | incompatible | rollback | unwritable
    │   ├── CacheSkew      format newer than this build (reason incompatible): treat as no cache
    │   └── CacheUnwritable  export or mark write failed (reason unwritable)
    └── KeyFileError       keygen could not write the key file
        └── KeyFileExists  the key file already exists (keygen never overwrites)

Bad ``trusted_keys`` text or an unreadable signing key is a
:class:`~supervisor.errors.ConfigError` (``$.cache.trusted_keys[i]``,
``$.cache.signing_key``) from the constructor. No message here ever contains
key material.

:meth:`~LastKnownGood.export`, :meth:`~LastKnownGood.load` and
:meth:`~LastKnownGood.note_served` block (file I/O and fsync): call them from a
worker thread under trio. They are safe to call from several threads.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import os
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, NoReturn

import msgspec
import nacl.exceptions
import nacl.signing

from supervisor import reasons
from supervisor.errors import ConfigError, SupervisorError
from supervisor.sinks.atomic import fsync_directory, write_atomic

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "CacheError",
    "CacheReason",
    "CacheSkew",
    "CacheUnwritable",
    "CachedRevision",
    "KeyFileError",
    "KeyFileExists",
    "LastKnownGood",
    "encode_file",
    "encode_header",
    "format_verify_key",
    "generate_signing_key",
    "key_id_of",
    "parse_verify_key",
]

MAGIC: Final = b"TRIO-SUPERVISOR-LKG\n"
FORMAT_VERSION: Final = 1
MAX_HEADER_BYTES: Final = 64 * 1024
SIGNATURE_BYTES: Final = 64
VERIFY_KEY_PREFIX: Final = "ed25519:"
SIGNING_KEY_PREFIX: Final = "ed25519-secret:"
KEY_BYTES: Final = 32
KEY_ID_HEX_DIGITS: Final = 16
SERVED_SUFFIX: Final = ".served"
_LENGTH: Final = struct.Struct(">I")

# Labels beyond the revision reasons of supervisor.reasons; spelled once here.
ROLLBACK: Final = "rollback"
UNWRITABLE: Final = "unwritable"
CacheReason = Literal["corrupt", "denied", "incompatible", "rollback", "unwritable"]


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- errors


class CacheError(SupervisorError):
    """The cache was refused (or could not be written); see the module docstring.

    ``reason`` is the label, ``path`` the file at fault (the cache, or its
    ``.served`` mark), ``detail`` the explanation without the path, and
    ``revision`` the cached revision id when the refusal got far enough to
    know it authentically (else None).
    """

    def __init__(
        self, reason: CacheReason, path: str, detail: str, *, revision: int | None = None
    ) -> None:
        self.reason: CacheReason = reason
        self.path = path
        self.detail = detail
        self.revision = revision
        super().__init__(f"last-known-good cache {path}: {reason}: {detail}")


class CacheSkew(CacheError):
    """The cache's format is newer than this build reads: report it, treat it as no cache.

    The file is authentic (its signature verified) and probably intact: a
    newer build wrote it, and this one was rolled back onto the same volume.
    """

    def __init__(self, path: str, detail: str, *, format_version: int) -> None:
        self.format_version = format_version
        super().__init__(reasons.INCOMPATIBLE, path, detail)


class CacheUnwritable(CacheError):
    """The cache or its served-revision mark could not be written (``OSError`` chained)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(UNWRITABLE, path, detail)


class KeyFileError(SupervisorError):
    """``keygen`` could not write the signing key file."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"signing key {path}: {detail}")


class KeyFileExists(KeyFileError):
    """The key file already exists; keygen never overwrites a key."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "already exists; refusing to overwrite a key")


# --------------------------------------------------------------------------- keys


def key_id_of(verify_key: nacl.signing.VerifyKey) -> str:
    """The short id a header names its signing key by: 16 hex digits of SHA-256."""
    return hashlib.sha256(bytes(verify_key)).hexdigest()[:KEY_ID_HEX_DIGITS]


def format_verify_key(verify_key: nacl.signing.VerifyKey) -> str:
    """``ed25519:<base64>``: the text ``trusted_keys`` accepts and ``keygen`` prints."""
    return VERIFY_KEY_PREFIX + base64.b64encode(bytes(verify_key)).decode("ascii")


def _decode_key_text(text: str, prefix: str, what: str) -> bytes:
    # Messages never quote the text: it may be a secret pasted in the wrong place.
    stripped = text.strip()
    if not stripped.startswith(prefix):
        raise ValueError(f"expected a {what} of the form '{prefix}<base64 of 32 bytes>'")
    try:
        raw = base64.b64decode(stripped[len(prefix) :], validate=True)
    except binascii.Error as exc:
        raise ValueError(f"the {what} is not valid base64") from exc
    if len(raw) != KEY_BYTES:
        raise ValueError(f"the {what} is {len(raw)} bytes, expected {KEY_BYTES}")
    return raw


def parse_verify_key(text: str) -> tuple[str, nacl.signing.VerifyKey]:
    """Parse ``ed25519:<base64 of 32 bytes>`` into (key id, key); ValueError when malformed."""
    key = nacl.signing.VerifyKey(_decode_key_text(text, VERIFY_KEY_PREFIX, "verify key"))
    return key_id_of(key), key


def _load_signing_key(path: str) -> nacl.signing.SigningKey:
    where = "$.cache.signing_key"
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except OSError as exc:
        raise ConfigError(where, f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ConfigError(where, f"{path}: not a signing key file (not ASCII text)") from exc
    try:
        seed = _decode_key_text(text, SIGNING_KEY_PREFIX, "signing key")
    except ValueError as exc:
        raise ConfigError(where, f"{path}: {exc}") from exc
    return nacl.signing.SigningKey(seed)


def generate_signing_key(out_path: str) -> str:
    """Write a new Ed25519 signing key to ``out_path`` (mode 0600) and return its verify key text.

    Never overwrites: an existing file (or symlink, even dangling) raises
    :class:`KeyFileExists`; any other failure raises :class:`KeyFileError`
    and leaves no file behind. The returned text is exactly what
    ``[cache].trusted_keys`` accepts.
    """
    key = nacl.signing.SigningKey.generate()
    data = (SIGNING_KEY_PREFIX + base64.b64encode(bytes(key)).decode("ascii") + "\n").encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        # O_EXCL is the refusal to overwrite, race-free; it also refuses to
        # follow a symlink planted at the path.
        fd = os.open(out_path, flags, 0o600)
    except FileExistsError as exc:
        raise KeyFileExists(out_path) from exc
    except OSError as exc:
        raise KeyFileError(out_path, f"cannot create: {exc.strerror or exc}") from exc
    try:
        try:
            os.fchmod(fd, 0o600)  # the umask may only narrow the mode; make it exact
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(os.path.dirname(out_path) or ".")
    except OSError as exc:
        # The file is ours (O_EXCL): a half-written key must not survive to be
        # trusted later.
        with contextlib.suppress(OSError):
            os.unlink(out_path)
        raise KeyFileError(out_path, f"cannot write: {exc.strerror or exc}") from exc
    return format_verify_key(key.verify_key)


# --------------------------------------------------------------------------- format

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]
_Sha256Hex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
_KeyId = Annotated[str, msgspec.Meta(pattern=f"^[0-9a-f]{{{KEY_ID_HEX_DIGITS}}}$")]


class _Header(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The signed header of format_version 1 (field order is the on-disk order)."""

    format_version: int
    revision: _NonNegative
    generation: _NonNegative
    schema_version: _NonNegative
    created_at: datetime
    body_length: _NonNegative
    body_sha256: _Sha256Hex
    key_id: _KeyId


class _Envelope(msgspec.Struct):
    """The two fields every format version keeps, read before the signature is checked.

    Lenient on purpose (unknown fields ignored, key_id of any type) so that a
    newer format's header still yields its version and key, and surfaces as
    skew rather than as corruption.
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
    format_version: int = FORMAT_VERSION,
) -> bytes:
    """The header bytes for ``body`` (format_version 1 fields)."""
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)  # a naive clock is taken to be UTC
    header = _Header(
        format_version=format_version,
        revision=revision,
        generation=generation,
        schema_version=schema_version,
        created_at=created_at.astimezone(UTC),
        body_length=len(body),
        body_sha256=hashlib.sha256(body).hexdigest(),
        key_id=key_id,
    )
    return msgspec.json.encode(header)


def encode_file(header: bytes, body: bytes, signing_key: nacl.signing.SigningKey) -> bytes:
    """Frame and sign: magic, header length, header, signature, body."""
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    signed = MAGIC + _LENGTH.pack(len(header)) + header
    return signed + signing_key.sign(signed).signature + body


def _shown(value: object) -> str:
    # Values from an unauthenticated file: bounded, repr-escaped, before they
    # reach a log line.
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _decode_file(
    data: bytes, path: str, trusted: Mapping[str, nacl.signing.VerifyKey]
) -> tuple[_Header, bytes]:
    """Verify and split a cache file; raises CacheError (see the module docstring)."""

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
    if envelope.format_version < FORMAT_VERSION:
        corrupt(f"format_version {envelope.format_version} was never written by any build")

    # 4. The fields, and the body they vouch for.
    try:
        header = msgspec.json.decode(header_bytes, type=_Header)
    except msgspec.DecodeError as exc:
        corrupt(f"the header is authentic but malformed: {exc}")
    if header.key_id != signer or header.created_at.tzinfo is None:
        corrupt("the header is authentic but inconsistent", header.revision)
    if len(body) != header.body_length:
        corrupt(
            f"the body is {len(body)} bytes but the signed header says {header.body_length} "
            f"(truncated or appended to)",
            header.revision,
        )
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), header.body_sha256):
        corrupt("the body's SHA-256 does not match the signed header", header.revision)
    return header, body


# --------------------------------------------------------------------------- the cache


@dataclass(frozen=True)
class CachedRevision:
    """A verified revision read from the cache."""

    revision: int
    generation: int
    schema_version: int
    created_at: datetime
    body: bytes = field(repr=False)
    key_id: str
    _clock: Callable[[], datetime] = field(default=_utcnow, repr=False, compare=False)

    @property
    def age_s(self) -> float:
        """Seconds since it was exported, by the cache's clock; 0 if that clock is behind."""
        return max(0.0, (self._clock() - self.created_at).total_seconds())


def _parse_trusted(texts: Sequence[str]) -> dict[str, nacl.signing.VerifyKey]:
    trusted: dict[str, nacl.signing.VerifyKey] = {}
    first_index: dict[str, int] = {}
    for index, text in enumerate(texts):
        where = f"$.cache.trusted_keys[{index}]"
        if not isinstance(text, str):
            raise ConfigError(where, "expected a string")
        try:
            key_id, key = parse_verify_key(text)
        except ValueError as exc:
            raise ConfigError(where, str(exc)) from exc
        known = trusted.get(key_id)
        if known is not None and bytes(known) != bytes(key):
            # 64-bit ids: practically impossible, but two keys under one id
            # would make verification ambiguous, so say so.
            raise ConfigError(
                where, f"key id {key_id} collides with trusted_keys[{first_index[key_id]}]"
            )
        trusted[key_id] = key
        first_index.setdefault(key_id, index)
    return trusted


class LastKnownGood:
    """One replica's signed cache file and its served-revision mark (module docstring)."""

    def __init__(
        self,
        path: str,
        *,
        signing_key_path: str | None,
        trusted_keys: Sequence[str],
        max_schema_version: int,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._path = path
        self._served_path = path + SERVED_SUFFIX
        self._trusted = _parse_trusted(trusted_keys)
        # Loaded now, not at the first export: a bad key is a configuration
        # error that `check` and boot should report, not a silent export failure.
        self._signing_key = (
            _load_signing_key(signing_key_path) if signing_key_path is not None else None
        )
        self.signing_key_id: str | None = None
        self.signing_key_trusted = False
        if self._signing_key is not None:
            verify = self._signing_key.verify_key
            self.signing_key_id = key_id_of(verify)
            known = self._trusted.get(self.signing_key_id)
            # Exports signed by an untrusted key would be refused ("denied") at
            # the next boot: the caller warns when this is False.
            self.signing_key_trusted = known is not None and bytes(known) == bytes(verify)
        self._max_schema_version = max_schema_version
        self._clock = clock
        self._lock = threading.Lock()
        # The mark as this process knows it (max of what it noted and read),
        # and what the .served file is known to hold (None: not read yet).
        self._mark = 0
        self._persisted_mark: int | None = None

    @property
    def path(self) -> str:
        return self._path

    @property
    def served_path(self) -> str:
        return self._served_path

    @property
    def trusted_key_ids(self) -> tuple[str, ...]:
        return tuple(self._trusted)

    # ----------------------------------------------------------------- the mark

    def _read_mark_file(self) -> int:
        """The .served file's value; 0 when missing; CacheError(corrupt) when unusable."""
        try:
            with open(self._served_path, "rb") as f:
                raw = f.read(64)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise CacheError(
                reasons.CORRUPT,
                self._served_path,
                f"the served-revision mark cannot be read: {exc.strerror or exc}",
            ) from exc
        text = raw.strip()
        if not text.isdigit() or len(text) > 20:
            raise CacheError(
                reasons.CORRUPT,
                self._served_path,
                "the served-revision mark is not a revision id; delete it to reset "
                "rollback protection",
            )
        return int(text)

    def _known_mark(self) -> int:
        """The mark for a write path: a garbled or unreadable file counts as 0 and is rewritten."""
        if self._persisted_mark is None:
            try:
                self._persisted_mark = self._read_mark_file()
            except CacheError:
                self._persisted_mark = -1  # never equal to a target: forces a rewrite
            self._mark = max(self._mark, self._persisted_mark)
        return self._mark

    def _write_mark(self, value: int) -> None:
        if self._persisted_mark == value:
            return  # no fsync per publish when nothing changed
        try:
            write_atomic(self._served_path, f"{value}\n".encode("ascii"), mode=0o600)
        except OSError as exc:
            raise CacheUnwritable(
                self._served_path,
                f"the served-revision mark could not be written: {exc.strerror or exc}",
            ) from exc
        self._persisted_mark = value

    def note_served(self, revision: int) -> None:
        """Record that this replica served ``revision``: raise the mark to it if below.

        Raises :class:`CacheUnwritable` when the mark file cannot be written;
        the mark is raised in memory regardless, and the write is retried by
        the next call.
        """
        if revision < 0:
            raise ValueError(f"revision must be >= 0, got {revision}")
        with self._lock:
            target = max(self._known_mark(), revision)
            self._mark = target
            self._write_mark(target)

    # ----------------------------------------------------------------- export

    def export(self, *, revision: int, generation: int, schema_version: int, body: bytes) -> None:
        """Sign and durably write ``body`` as the cache; set the served mark to ``revision``.

        Raises :class:`CacheUnwritable` (``OSError`` chained) when either file
        cannot be written, or when no signing key is configured. Blocking.
        """
        for name, value in (
            ("revision", revision),
            ("generation", generation),
            ("schema_version", schema_version),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self._signing_key is None or self.signing_key_id is None:
            raise CacheUnwritable(self._path, "no signing key is configured ($.cache.signing_key)")
        header = encode_header(
            revision=revision,
            generation=generation,
            schema_version=schema_version,
            created_at=self._clock(),
            body=body,
            key_id=self.signing_key_id,
        )
        data = encode_file(header, body, self._signing_key)
        with self._lock:
            # Order the two writes so that a crash between them never leaves
            # the mark above the cache's revision (that would refuse a good
            # cache as a rollback).
            if revision < self._known_mark():
                self._write_mark(revision)
                self._mark = revision
                self._write_cache(data)
            else:
                self._write_cache(data)
                self._mark = revision
                self._write_mark(revision)

    def _write_cache(self, data: bytes) -> None:
        try:
            write_atomic(self._path, data, mode=0o600)
        except OSError as exc:
            raise CacheUnwritable(
                self._path, f"the cache could not be written: {exc.strerror or exc}"
            ) from exc

    # ----------------------------------------------------------------- load

    def load(self) -> CachedRevision | None:
        """The verified cached revision; None when there is no cache file.

        Raises :class:`CacheSkew` for a newer format (treat as no cache) and
        :class:`CacheError` for every other refusal. Blocking.
        """
        try:
            with open(self._path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CacheError(
                reasons.CORRUPT, self._path, f"cannot be read: {exc.strerror or exc}"
            ) from exc
        header, body = _decode_file(data, self._path, self._trusted)
        if header.schema_version > self._max_schema_version:
            raise CacheError(
                reasons.INCOMPATIBLE,
                self._path,
                f"schema_version {header.schema_version} is newer than this build reads "
                f"({self._max_schema_version})",
                revision=header.revision,
            )
        with self._lock:
            # Strict here, unlike the write paths: a garbled mark refuses the
            # cache instead of quietly disabling rollback protection.
            mark = max(self._mark, self._read_mark_file())
        if header.revision < mark:
            raise CacheError(
                ROLLBACK,
                self._path,
                f"revision {header.revision} is older than revision {mark}, which this "
                f"replica already served",
                revision=header.revision,
            )
        return CachedRevision(
            revision=header.revision,
            generation=header.generation,
            schema_version=header.schema_version,
            created_at=header.created_at,
            body=body,
            key_id=header.key_id,
            _clock=self._clock,
        )
