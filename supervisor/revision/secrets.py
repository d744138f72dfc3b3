"""Resolving a key's secret reference to the secret's bytes: :class:`EnvFileResolver`.

A secret is resolved at compile time, hashed, and dropped: snapshots carry its digest.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

from supervisor import reasons
from supervisor.bounds import PATH_BYTES, shown
from supervisor.configchecks import SYSTEM_DIRS, credential_files, own_env_name
from supervisor.revision.errors import RevisionError

if TYPE_CHECKING:
    from supervisor.config import Config, RevisionConfig

__all__ = ["MAX_SECRET_BYTES", "EnvFileResolver", "SecretResolver"]

MAX_SECRET_BYTES: Final = 64 * 1024
"""A secret file larger than this is refused rather than read (a key, not a payload)."""


class SecretResolver(Protocol):
    """Turns a secret reference into the secret's bytes. Must be thread-safe."""

    def resolve(self, reference: str) -> bytes:
        """The secret's bytes; raises ``RevisionError(reason="secret")`` otherwise.

        ``env:NAME`` is the environment variable; ``file:PATH`` the file's bytes.
        One trailing ``\\n`` or ``\\r\\n`` is removed, so ``echo value > file`` works.
        A relative PATH resolves against the working directory.
        Unresolvable: an unknown scheme, a variable unset, a file missing or unreadable,
        an empty secret, or a place outside ``[revision]``'s confinement.
        A transient shortage reading a file (EMFILE, ENFILE, ENOMEM, EAGAIN) is ``unavailable``.
        It is retried with backoff, never mistaken for a missing secret.
        Refusals name the reference, never the value: a value is a credential.
        The compile stage prefixes the key's ``$.path``.
        """
        ...


def _refuse(detail: str) -> RevisionError:
    return RevisionError(reasons.SECRET, detail)


# The process or the system ran short of something for a moment (descriptors,
# memory): the secret is not the problem, and the next attempt may succeed.
_TRANSIENT_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


def _os_refusal(path: str, exc: OSError) -> RevisionError:
    if exc.errno in _TRANSIENT_ERRNOS:
        detail = f"{_file(path)}: {exc.strerror or type(exc).__name__}"
        return RevisionError(reasons.UNAVAILABLE, f"{detail} (transient; retried)")
    return _unresolvable(path)


class EnvFileResolver:
    """Resolves ``env:NAME`` from an environment mapping and ``file:PATH`` from disk.

    ``environ`` defaults to the live ``os.environ`` (read at each resolution,
    not copied at construction); tests and benchmarks inject a mapping.

    Never resolved, whatever the lists below say:

    - a variable the daemon itself reads (:data:`~supervisor.configchecks.OWN_ENV_NAMES`):
      its settings, the DSN among them, libpq's ``PG*``, ``KUBECONFIG`` ...;
    - a file under ``/proc``, ``/sys``, ``/dev`` or the daemon's service-account directory
      (:data:`~supervisor.configchecks.SYSTEM_DIRS`). ``/proc/sys/kernel/ostype`` would
      give a key whose value anyone knows;
    - any of ``credentials``, the files the daemon reads credentials from
      (:func:`~supervisor.configchecks.credential_files`), under any name.
      The file opened is compared by device and inode: a symlink or hard link is refused too.

    ``env_prefixes`` and ``dirs`` confine where references may point
    (``[revision].secret_env_prefixes`` and ``secret_dirs``; empty = anywhere else).
    A publisher must not make the replica hash, and serve the digest of, whatever it can read.
    A reference outside is refused before anything is looked up.
    A file reference inside is refused with one message whatever the cause.
    (Missing, unreadable, not a regular file, more than one hard link, empty, too large,
    or a symlink leading outside.) So a refusal does not tell whether a file exists.
    Confinement is decided again on the file actually opened.
    So a symlink swapped between the check and the open cannot lead outside.
    Nor can a mount: a file on a kernel filesystem (proc, sysfs, cgroup ...) is refused.
    That is ``statfs``'s type of the file opened, wherever it is mounted.

    Nothing but a regular file is ever opened for reading. The path is first opened
    with ``O_PATH``, which runs no device driver and cannot block on a FIFO.
    It is checked with ``fstat``; only the checked file is then opened for reading.
    That goes through ``/proc/self/fd``: the same inode, whatever the path names meanwhile.
    """

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        env_prefixes: Sequence[str] = (),
        dirs: Sequence[str] = (),
        credentials: Sequence[str] = (),
    ) -> None:
        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._prefixes = tuple(env_prefixes)
        self._dirs = tuple(os.path.abspath(d) for d in dirs)
        self._real_dirs = tuple(os.path.realpath(d) for d in dirs)
        self._credentials = tuple(credentials)

    @classmethod
    def from_config(cls, config: RevisionConfig, *, credentials: Sequence[str] = (),
                    environ: Mapping[str, str] | None = None) -> EnvFileResolver:
        """The resolver ``[revision]`` asks for (on the live environment by default);
        ``credentials``: the daemon's own credential files (:func:`for_daemon` names them)."""
        return cls(environ, env_prefixes=config.secret_env_prefixes, dirs=config.secret_dirs,
                   credentials=credentials)

    @classmethod
    def for_daemon(cls, config: Config, config_path: str | None = None, *,
                   environ: Mapping[str, str] | None = None) -> EnvFileResolver:
        """The resolver of a replica (and ``publish``) with ``config``: ``[revision]``'s
        confinement, and every credential file of ``config`` refused."""
        return cls.from_config(config.revision, environ=environ, credentials=[
            path for _, path in credential_files(config, environ, config_path)])

    def resolve(self, reference: str) -> bytes:
        scheme, sep, target = _parts(reference)
        if sep and scheme == "env" and target:
            return self._from_env(target)
        if sep and scheme == "file" and target:
            return self._from_file(target)
        # Echo nothing of it: a malformed reference is often a pasted secret.
        raise _refuse(_UNSUPPORTED)

    def check_place(self, reference: str) -> None:
        """Refuse (``secret``) a reference whose place alone is outside the confinement,
        in the words :meth:`resolve` uses; nothing is looked up, nothing is read."""
        scheme, sep, target = _parts(reference)
        if sep and scheme == "env" and target:
            self._check_env_place(target)
        elif sep and scheme == "file" and target:
            self._check_file_place(target)

    def _check_env_place(self, name: str) -> None:
        if self._prefixes and not name.startswith(self._prefixes):
            raise _refuse(
                f"{_variable(name)} is outside [revision].secret_env_prefixes"
            )
        if own_env_name(name):
            raise _refuse(f"{_variable(name)} is one the daemon itself reads "
                          "(its settings, PG*, KUBECONFIG ...): never a secret reference")

    def _check_file_place(self, path: str) -> None:
        # Decided on the spelled path alone (.. collapsed): nothing is touched.
        # POSIX lets abspath keep a leading "//", which Linux reads as "/".
        spelled = os.path.abspath(path)
        if spelled.startswith("//"):
            spelled = "/" + spelled.lstrip("/")
        if self._dirs and not _under(spelled, self._dirs):
            raise _refuse(f"{_file(path)} is outside [revision].secret_dirs")
        if _under(spelled, SYSTEM_DIRS):
            raise _refuse(f"{_file(path)} is under /proc, /sys or /dev (or the "
                          "daemon's own service account): never a secret")

    def _from_env(self, name: str) -> bytes:
        self._check_env_place(name)
        value = self._environ.get(name)
        if not value:
            raise _refuse(f"{_variable(name)} is not set or empty")
        try:
            # surrogateescape gives back the exact bytes os.environ decoded.
            return value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise _refuse(f"{_variable(name)} cannot be encoded as bytes") from None

    def _from_file(self, path: str) -> bytes:
        self._check_file_place(path)
        # A symlink may lead outside, or into /proc: refused like any other unusable file.
        real = os.path.realpath(path)
        if _under(real, _real_system_dirs(SYSTEM_DIRS)) or (
                self._dirs and not _under(real, self._real_dirs)):
            raise _unresolvable(path)
        # Checked again on what was opened: a symlink swapped between the
        # check above and the open must not lead outside (TOCTOU).
        return _read_file(path, confined_to=self._real_dirs, credentials=self._credentials)


def _file(path: str) -> str:
    """``secret file PATH`` inside a detail, the path shown bounded (bounds.shown)."""
    return f"secret file {shown(path, PATH_BYTES)}"


def _variable(name: str) -> str:
    """``environment variable NAME`` inside a detail, the name shown bounded."""
    return f"environment variable {shown(name, PATH_BYTES)}"


_UNSUPPORTED: Final = 'unsupported secret reference: expected "env:NAME" or "file:PATH"'


def _parts(reference: str) -> tuple[str, str, str]:
    """Scheme, separator and target of ``reference``; a NUL byte is refused.

    No path or variable name can hold one: the OS calls would raise ValueError.
    """
    if "\x00" in reference:
        raise _refuse(_UNSUPPORTED)
    return reference.partition(":")


def _real_system_dirs(dirs: tuple[str, ...]) -> tuple[str, ...]:
    # /var/run is usually a symlink to /run: both spellings, and where they lead.
    return tuple({*dirs, *(os.path.realpath(d) for d in dirs)})


def _under(path: str, dirs: tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


def _unresolvable(path: str) -> RevisionError:
    # One message for every cause: which one it was would tell whoever
    # publishes whether the file exists on this host.
    return _refuse(
        f"{_file(path)} cannot be resolved (it must be a readable, non-empty "
        f"regular file of at most {MAX_SECRET_BYTES} bytes, with one name)"
    )


def _opened_at(fd: int) -> str | None:
    """The path the kernel gives the file opened as ``fd`` (Linux), None without /proc."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _opened_inside(fd: int, path: str, opened: os.stat_result, dirs: tuple[str, ...]) -> bool:
    """Is the file opened (``fd``; ``opened``: its fstat) under ``dirs``?

    Decided after the open, so a symlink swapped before it is caught.
    On Linux the kernel names the opened file (``/proc/self/fd``), atomically.
    Elsewhere the real path of ``path`` must be under ``dirs`` and be the file opened
    (device and inode).
    """
    at = _opened_at(fd)
    if at is not None:
        return _under(at, dirs)
    real = os.path.realpath(path)
    if not _under(real, dirs):
        return False
    try:
        there = os.stat(real)
    except OSError:
        return False
    return _same_file(there, opened)


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _is_credential(opened: os.stat_result, credentials: tuple[str, ...]) -> bool:
    for credential in credentials:
        try:
            if _same_file(os.stat(credential), opened):
                return True
        except OSError:
            continue  # absent or unreadable: nothing there to protect
    return False


# Kernel filesystems (statfs(2) f_type): their files are the kernel's state, never
# a secret, wherever they are mounted (a bind mount or a hostPath volume of /proc
# inside a secret directory keeps every path check inside it). devtmpfs reports
# tmpfs's number, but holds devices, which are refused as not regular files.
_KERNEL_FILESYSTEMS: Final = frozenset({
    0x9FA0,  # proc
    0x62656572,  # sysfs
    0x0027E0EB, 0x63677270,  # cgroup, cgroup2
    0x73636673, 0x64626720, 0x74726163,  # securityfs, debugfs, tracefs
    0xCAFE4A11, 0x62656570, 0x6165676C,  # bpf, configfs, pstore
    0xDE5E81E4, 0x42494E4D, 0xF97CFF8C,  # efivarfs, binfmt_misc, selinuxfs
    0x1CD1, 0x19800202, 0x65735543, 0x6E736673,  # devpts, mqueue, fusectl, nsfs
})


def _filesystem_type(fd: int) -> int | None:
    """statfs(2)'s f_type of the file ``fd`` holds (Linux; an O_PATH descriptor is
    enough), None where it cannot be asked."""
    fstatfs = _libc_fstatfs()
    if fstatfs is None:
        return None
    buffer = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit
    if fstatfs(fd, buffer) != 0:
        return None
    # f_type is the struct's first field, a C long on x86 and ARM (negative on
    # 32-bit for the numbers above 2**31: masked to 32 bits).
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


@functools.cache
def _libc_fstatfs() -> Callable[[int, Any], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.fstatfs
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_void_p)
    function.restype = ctypes.c_int
    return cast("Callable[[int, Any], int]", function)


# O_PATH (Linux): a handle on the file that reads nothing and opens nothing, so
# a device's driver never runs and a FIFO never blocks. Elsewhere a
# non-blocking, no-controlling-terminal open stands in for it.
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_LOOK_FLAGS: Final = (getattr(os, "O_PATH", 0) or (os.O_RDONLY | os.O_NONBLOCK
                                                   | getattr(os, "O_NOCTTY", 0))) | _CLOEXEC


def _look(path: str) -> int:
    """A descriptor on the file at ``path`` (symlinks followed, as Kubernetes secret
    volumes need) that has opened nothing (:data:`_LOOK_FLAGS`)."""
    return os.open(path, _LOOK_FLAGS)


def _open_checked(handle: int, path: str, looked: os.stat_result) -> int:
    """Open for reading the file ``handle`` holds, and only that file."""
    if not getattr(os, "O_PATH", 0):
        return os.dup(handle)  # already a read descriptor
    try:
        fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | _CLOEXEC)
    except FileNotFoundError:
        # No /proc: the path again, compared with what was checked below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | _CLOEXEC)
    if not _same_file(os.fstat(fd), looked):
        os.close(fd)
        raise _unresolvable(path)
    return fd


def _read_file(path: str, *, confined_to: tuple[str, ...] = (),
               credentials: tuple[str, ...] = ()) -> bytes:
    try:
        handle = _look(path)
    except OSError as exc:
        raise _os_refusal(path, exc) from None
    try:
        looked = os.fstat(handle)
        # One name only: a hard link placed in a secret directory may be another
        # name of any file its maker could read.
        if not stat.S_ISREG(looked.st_mode) or looked.st_nlink != 1:
            raise _unresolvable(path)
        at = _opened_at(handle)
        if at is not None and _under(at, _real_system_dirs(SYSTEM_DIRS)):
            raise _unresolvable(path)
        if _filesystem_type(handle) in _KERNEL_FILESYSTEMS:
            raise _unresolvable(path)
        if confined_to and not _opened_inside(handle, path, looked, confined_to):
            raise _unresolvable(path)
        if _is_credential(looked, credentials):
            raise _unresolvable(path)
        fd = _open_checked(handle, path, looked)
        try:
            with os.fdopen(fd, "rb", closefd=False) as reader:
                data = reader.read(MAX_SECRET_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _os_refusal(path, exc) from None
    finally:
        os.close(handle)
    if len(data) > MAX_SECRET_BYTES:
        raise _unresolvable(path)
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise _unresolvable(path)
    return data
