"""The Ed25519 keys that sign the cache: their text forms, ids, and the key file.

No message here ever contains key material. Rotation: docs/operations.md, "Cache key rotation".
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
from collections.abc import Sequence
from typing import Final

import nacl.signing

from supervisor.errors import ConfigError
from supervisor.sinks.atomic import fsync_directory
from supervisor.sinks.lkg.errors import KeyFileError, KeyFileExists

__all__ = [
    "KEY_BYTES",
    "KEY_ID_HEX_DIGITS",
    "SIGNING_KEY_PREFIX",
    "VERIFY_KEY_PREFIX",
    "format_verify_key",
    "generate_signing_key",
    "key_id_of",
    "load_signing_key",
    "parse_trusted",
    "parse_verify_key",
]

VERIFY_KEY_PREFIX: Final = "ed25519:"
SIGNING_KEY_PREFIX: Final = "ed25519-secret:"
KEY_BYTES: Final = 32
KEY_ID_HEX_DIGITS: Final = 16


def key_id_of(verify_key: nacl.signing.VerifyKey) -> str:
    """The short id a header names its signing key by: 16 hex digits of SHA-256."""
    return hashlib.sha256(bytes(verify_key)).hexdigest()[:KEY_ID_HEX_DIGITS]


def format_verify_key(verify_key: nacl.signing.VerifyKey) -> str:
    """``ed25519:<base64>``: the text ``trusted_keys`` accepts and ``keygen`` prints.

    The base64 is canonical: padded, standard alphabet, no inner whitespace, unused
    low bits zero. So each key has exactly one text.
    """
    return VERIFY_KEY_PREFIX + base64.b64encode(bytes(verify_key)).decode("ascii")


def _decode_key_text(text: str, prefix: str, what: str) -> bytes:
    # Messages never quote the text: it may be a secret pasted in the wrong place.
    stripped = text.strip()
    if not stripped.startswith(prefix):
        raise ValueError(f"expected a {what} of the form '{prefix}<base64 of 32 bytes>'")
    payload = stripped[len(prefix) :]
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII text
        raise ValueError(f"the {what} is not valid base64") from exc
    if len(raw) != KEY_BYTES:
        raise ValueError(f"the {what} is {len(raw)} bytes, expected {KEY_BYTES}")
    if base64.b64encode(raw).decode("ascii") != payload:
        # Non-zero unused bits: the same key under a second spelling.
        raise ValueError(f"the {what} is not canonical base64")
    return raw


def parse_verify_key(text: str) -> tuple[str, nacl.signing.VerifyKey]:
    """Parse ``ed25519:<base64 of 32 bytes>`` into (key id, key); ValueError when malformed.

    The base64 must be canonical (see :func:`format_verify_key`).
    Whitespace around the text is ignored.
    """
    key = nacl.signing.VerifyKey(_decode_key_text(text, VERIFY_KEY_PREFIX, "verify key"))
    return key_id_of(key), key


def parse_trusted(texts: Sequence[str], *, where_key: str = "$.cache.trusted_keys"
                  ) -> dict[str, nacl.signing.VerifyKey]:
    """A trusted_keys list as {key id: key}; ConfigError naming the entry when one is bad."""
    trusted: dict[str, nacl.signing.VerifyKey] = {}
    first_index: dict[str, int] = {}
    for index, text in enumerate(texts):
        where = f"{where_key}[{index}]"
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


def load_signing_key(path: str) -> nacl.signing.SigningKey:
    """Read the signing key file; ConfigError (``$.cache.signing_key``) when unusable."""
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
    """Write a new Ed25519 signing key to ``out_path`` (mode 0600); return its verify key text.

    The file is ``ed25519-secret:<canonical base64 of the 32-byte seed>`` and a newline.
    Never overwrites: an existing file (or symlink, even dangling) raises
    :class:`KeyFileExists`. Any other failure raises :class:`KeyFileError` and
    leaves no file. The returned text is exactly what ``[cache].trusted_keys`` accepts.
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
