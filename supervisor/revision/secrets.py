"""Resolving a key's secret reference to the secret's bytes.

Contract: a reference is ``env:NAME`` (the environment variable NAME) or
``file:PATH`` (the file's bytes, one trailing ``\\n`` or ``\\r\\n`` removed so
``echo value > file`` works; a relative PATH resolves against the working
directory). A reference that cannot be resolved (unknown scheme, variable
unset, file missing or unreadable, empty secret) raises
``RevisionError(reason="secret")``, except a transient shortage while
reading a file (EMFILE, ENFILE, ENOMEM, EAGAIN), which is ``unavailable``:
retried with backoff, and never mistaken for a missing secret.

Refusals name the reference, never the value: a reference is configuration,
a value is a credential. The compile stage prefixes the key's ``$.path``.

A secret is resolved at compile time, hashed, and dropped: snapshots carry the
SHA-256 digest only (see :mod:`supervisor.revision.compile`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from typing import Final, Protocol

from supervisor import reasons
from supervisor.revision.errors import RevisionError

__all__ = ["MAX_SECRET_BYTES", "EnvFileResolver", "SecretResolver"]

MAX_SECRET_BYTES: Final = 64 * 1024
"""A secret file larger than this is refused rather than read (a key, not a payload)."""


class SecretResolver(Protocol):
    """Turns a secret reference into the secret's bytes. Must be thread-safe."""

    def resolve(self, reference: str) -> bytes:
        """The secret's bytes; raises ``RevisionError(reason="secret")`` otherwise."""
        ...


def _refuse(detail: str) -> RevisionError:
    return RevisionError(reasons.SECRET, detail)


# The process or the system ran short of something for a moment (descriptors,
# memory): the secret is not the problem, and the next attempt may succeed.
_TRANSIENT_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


def _os_refusal(path: str, exc: OSError) -> RevisionError:
    detail = f"secret file {path}: {exc.strerror or type(exc).__name__}"
    if exc.errno in _TRANSIENT_ERRNOS:
        return RevisionError(reasons.UNAVAILABLE, f"{detail} (transient; retried)")
    return _refuse(detail)


class EnvFileResolver:
    """Resolves ``env:NAME`` from an environment mapping and ``file:PATH`` from disk.

    ``environ`` defaults to the live ``os.environ`` (read at each resolution,
    not copied at construction); tests and benchmarks inject a mapping.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ: Mapping[str, str] = os.environ if environ is None else environ

    def resolve(self, reference: str) -> bytes:
        scheme, sep, target = reference.partition(":")
        if sep and scheme == "env" and target:
            return self._from_env(target)
        if sep and scheme == "file" and target:
            return _from_file(target)
        # Echo nothing of it: a malformed reference is often a pasted secret.
        raise _refuse('unsupported secret reference: expected "env:NAME" or "file:PATH"')

    def _from_env(self, name: str) -> bytes:
        value = self._environ.get(name)
        if value is None:
            raise _refuse(f"environment variable {name} is not set")
        if not value:
            raise _refuse(f"environment variable {name} is empty")
        try:
            # surrogateescape gives back the exact bytes os.environ decoded.
            return value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise _refuse(f"environment variable {name} cannot be encoded as bytes") from None


def _from_file(path: str) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO must not hang the compile; fstat then
        # refuses anything but a regular file (symlinks are followed, as
        # Kubernetes secret volumes need).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _os_refusal(path, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _refuse(f"secret file {path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise _os_refusal(path, exc) from None
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise _refuse(f"secret file {path} is larger than {MAX_SECRET_BYTES} bytes")
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise _refuse(f"secret file {path} is empty")
    return data
