"""Resolving a key's secret reference to the secret's bytes.

Contract: a reference is ``env:NAME`` (the environment variable NAME) or
``file:PATH`` (the file's bytes, one trailing ``\\n`` or ``\\r\\n`` removed so
``echo value > file`` works; a relative PATH resolves against the working
directory). A reference that cannot be resolved (unknown scheme, variable
unset, file missing or unreadable, empty secret), or that points outside
``[revision].secret_env_prefixes`` / ``secret_dirs``, raises
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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from supervisor import reasons
from supervisor.revision.errors import RevisionError

if TYPE_CHECKING:
    from supervisor.config import RevisionConfig

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
    if exc.errno in _TRANSIENT_ERRNOS:
        detail = f"secret file {path}: {exc.strerror or type(exc).__name__}"
        return RevisionError(reasons.UNAVAILABLE, f"{detail} (transient; retried)")
    return _unresolvable(path)


class EnvFileResolver:
    """Resolves ``env:NAME`` from an environment mapping and ``file:PATH`` from disk.

    ``environ`` defaults to the live ``os.environ`` (read at each resolution,
    not copied at construction); tests and benchmarks inject a mapping.

    ``env_prefixes`` and ``dirs`` (``[revision].secret_env_prefixes`` and
    ``secret_dirs``; empty = anywhere) confine where references may point:
    whoever can publish must not make the replica hash, and serve the digest of,
    its own database password (``env:SUPERVISOR_CONTROL_PLANE__URL``) or any file
    it can read (``file:/proc/self/environ``). A reference outside is refused
    before anything is looked up. A file reference inside is refused with one
    message whatever the cause (missing, unreadable, not a regular file, empty,
    too large, or a symlink leading outside the directories), so a refusal
    does not tell the publisher whether a file exists. Confinement is decided
    again on the file actually opened, so a symlink swapped between the check
    and the open (whoever can write in a secret directory) cannot lead outside.
    """

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        env_prefixes: Sequence[str] = (),
        dirs: Sequence[str] = (),
    ) -> None:
        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._prefixes = tuple(env_prefixes)
        self._dirs = tuple(os.path.abspath(d) for d in dirs)
        self._real_dirs = tuple(os.path.realpath(d) for d in dirs)

    @classmethod
    def from_config(cls, config: RevisionConfig) -> EnvFileResolver:
        """The resolver ``[revision]`` asks for, on the live environment."""
        return cls(env_prefixes=config.secret_env_prefixes, dirs=config.secret_dirs)

    def resolve(self, reference: str) -> bytes:
        scheme, sep, target = reference.partition(":")
        if sep and scheme == "env" and target:
            return self._from_env(target)
        if sep and scheme == "file" and target:
            return self._from_file(target)
        # Echo nothing of it: a malformed reference is often a pasted secret.
        raise _refuse('unsupported secret reference: expected "env:NAME" or "file:PATH"')

    def check_place(self, reference: str) -> None:
        """Refuse (``secret``) a reference whose place alone is outside the confinement,
        in the words :meth:`resolve` uses; nothing is looked up, nothing is read."""
        scheme, sep, target = reference.partition(":")
        if sep and scheme == "env" and target:
            self._check_env_place(target)
        elif sep and scheme == "file" and target:
            self._check_file_place(target)

    def _check_env_place(self, name: str) -> None:
        if self._prefixes and not name.startswith(self._prefixes):
            raise _refuse(
                f"environment variable {name} is outside [revision].secret_env_prefixes"
            )

    def _check_file_place(self, path: str) -> None:
        # Decided on the spelled path alone (.. collapsed): nothing is touched.
        if self._dirs and not _under(os.path.abspath(path), self._dirs):
            raise _refuse(f"secret file {path} is outside [revision].secret_dirs")

    def _from_env(self, name: str) -> bytes:
        self._check_env_place(name)
        value = self._environ.get(name)
        if not value:
            raise _refuse(f"environment variable {name} is not set or empty")
        try:
            # surrogateescape gives back the exact bytes os.environ decoded.
            return value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise _refuse(f"environment variable {name} cannot be encoded as bytes") from None

    def _from_file(self, path: str) -> bytes:
        if self._dirs:
            self._check_file_place(path)
            # A symlink may lead outside: refused like any other unusable file.
            if not _under(os.path.realpath(path), self._real_dirs):
                raise _unresolvable(path)
            # Checked again on what was opened: a symlink swapped between the
            # check above and the open must not lead outside (TOCTOU).
            return _read_file(path, confined_to=self._real_dirs)
        return _read_file(path)


def _under(path: str, dirs: tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


def _unresolvable(path: str) -> RevisionError:
    # One message for every cause: which one it was would tell whoever
    # publishes whether the file exists on this host.
    return _refuse(
        f"secret file {path} cannot be resolved (it must be a readable, non-empty "
        f"regular file of at most {MAX_SECRET_BYTES} bytes)"
    )


def _opened_inside(fd: int, path: str, opened: os.stat_result, dirs: tuple[str, ...]) -> bool:
    """Is the file opened (``fd``; ``opened``: its fstat) under ``dirs``? Decided after
    the open, so a symlink swapped before it is caught. On Linux the kernel names
    the opened file (``/proc/self/fd``), atomically; elsewhere the real path of
    ``path`` must be under ``dirs`` and be the file opened (device and inode)."""
    try:
        return _under(os.readlink(f"/proc/self/fd/{fd}"), dirs)
    except OSError:
        pass  # no /proc: the portable check below
    real = os.path.realpath(path)
    if not _under(real, dirs):
        return False
    try:
        there = os.stat(real)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (opened.st_dev, opened.st_ino)


def _read_file(path: str, *, confined_to: tuple[str, ...] = ()) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO must not hang the compile; fstat then
        # refuses anything but a regular file (symlinks are followed, as
        # Kubernetes secret volumes need).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _os_refusal(path, exc) from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _unresolvable(path)
        if confined_to and not _opened_inside(fd, path, opened, confined_to):
            raise _unresolvable(path)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise _os_refusal(path, exc) from None
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise _unresolvable(path)
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise _unresolvable(path)
    return data
