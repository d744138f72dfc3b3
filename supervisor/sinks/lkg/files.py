"""The cache's files on disk: safe reads, durable writes, ownership, one daemon per cache."""

from __future__ import annotations

import fcntl
import os
import stat
import time
from collections.abc import Sequence
from typing import Final, Protocol

from supervisor.errors import ConfigError, StartError
from supervisor.filemodes import describe_mode, refuse_unsafe_place
from supervisor.sinks.atomic import directory_mode, fsync_directory, write_atomic

__all__ = [
    "LOCK_SUFFIX",
    "LOCK_WAIT_S",
    "CacheFiles",
    "CacheLock",
    "DurableFiles",
    "NotRegularFile",
    "describe_mode",
    "hold_cache_lock",
    "prepare_directory",
    "read_regular",
]

_WHERE: Final = "$.cache.path"
_READ_FLAGS: Final = (
    os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)
class NotRegularFile(Exception):
    """Something other than a regular file is at the path; ``kind`` says what."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(kind)


def read_regular(path: str, *, limit: int = -1) -> bytes | None:
    """The bytes of the regular file at ``path`` (at most ``limit``); None when nothing is there.

    Opens with ``O_NONBLOCK | O_NOFOLLOW`` and checks ``fstat`` before reading a byte.
    So a planted FIFO cannot hang the boot. Anything else (symlink, socket, device,
    directory) raises :class:`NotRegularFile`, naming what it is. ``OSError`` when unreadable.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        # ELOOP (a symlink under O_NOFOLLOW), ENXIO (a socket) ...: say what is there.
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            raise exc from None
        if not stat.S_ISREG(mode):
            raise NotRegularFile(describe_mode(mode)) from exc
        raise
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(describe_mode(mode))
    with open(fd, "rb", closefd=True) as f:
        # O_NONBLOCK has no effect on a regular file: this reads to the end.
        return f.read(limit)


class CacheFiles(Protocol):
    """How the cache writes and removes its two files.

    The seam tests replace, to stop or fail between two writes.
    """

    def write(self, path: str, data: bytes, *, mode: int) -> None:
        """Replace ``path`` with ``data``, atomically and durably; OSError when not done."""

    def remove(self, path: str) -> None:
        """Remove ``path`` durably; FileNotFoundError when absent, OSError otherwise."""


class DurableFiles:
    """The real :class:`CacheFiles`: atomic fsynced replacement, and unlink made durable.

    ``directory_mode``: the cache directory's mode at start, with which
    :func:`~supervisor.sinks.atomic.write_atomic` remakes a removed directory.
    """

    def __init__(self, directory_mode: int | None = None) -> None:
        self.directory_mode = directory_mode

    @classmethod
    def for_directory_of(cls, path: str) -> DurableFiles:
        """Files that make ``path``'s directory again with the mode it has now."""
        return cls(directory_mode(path))

    def write(self, path: str, data: bytes, *, mode: int) -> None:
        write_atomic(path, data, mode=mode, directory_mode=self.directory_mode)

    def remove(self, path: str) -> None:
        os.unlink(path)
        # Without it a power loss could bring the removed file back.
        fsync_directory(os.path.dirname(path) or ".")


def prepare_directory(directory: str, files: Sequence[str]) -> None:
    """Create ``directory`` when missing (0700, parents too), then refuse unsafe ownership or modes.

    The rules are :func:`~supervisor.filemodes.refuse_unsafe_place`'s. Here, another local
    user who could replace or delete these files could make the replica boot an old
    revision. Raises :class:`~supervisor.errors.ConfigError` at ``$.cache.path``, naming
    the path and its octal mode.
    """
    _create_missing(directory or ".")
    refuse_unsafe_place(_WHERE, directory or ".", "the cache directory", files)


def _create_missing(directory: str) -> None:
    missing: list[str] = []
    at = os.path.abspath(directory)
    while not os.path.lexists(at):
        missing.append(at)
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    for path in reversed(missing):
        try:
            # 0700 narrowed by the umask, never widened: nobody else may list
            # or replace the cache.
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue  # created meanwhile by someone else: checked below like any other
        except OSError as exc:
            raise ConfigError(
                _WHERE, f"cannot create the cache directory {path}: {exc.strerror or exc}"
            ) from exc


LOCK_SUFFIX: Final = ".lock"
#: How long a second daemon waits for the cache lock, and how often it tries.
LOCK_WAIT_S: Final = 10.0
_LOCK_RETRY_S: Final = 0.1


class CacheLock:
    """The held lock; :meth:`release` (or the process ending) lets it go."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def hold_cache_lock(cache_path: str, *, wait_s: float = LOCK_WAIT_S) -> CacheLock | None:
    """Lock ``cache_path`` for this process, waiting up to ``wait_s`` for another holder.

    Two daemons on one cache would each rewrite the cache, mark and forward file with their
    revisions. The next boot would serve whichever wrote last.

    Takes ``flock(LOCK_EX | LOCK_NB)`` on ``<cache path>.lock`` (0600; a missing
    directory is made 0700) and keeps it open. The kernel releases it when the process
    ends, so a crash leaves no stale lock. The holder writes its pid into the file.

    Raises :class:`~supervisor.errors.StartError` (exit 1) naming the path and the
    holder's pid when another daemon still holds it after ``wait_s``. Returns None
    when the lock file cannot be made (directory is a file, read-only, full). That is
    no reason to stop serving: cache writes fail too, and ``/status`` ``sinks.cache``
    reports it. The caller logs that it runs unlocked.

    Blocking (it sleeps while it waits): call it before the event loop serves, or from a thread.
    """
    path = cache_path + LOCK_SUFFIX
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
    except OSError:
        return None
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                    raise StartError(
                        f"{cache_path} is in use by another daemon (pid {holder} holds the "
                        f"lock {path}, still after {wait_s:g} s): one daemon per cache"
                    ) from None
                time.sleep(_LOCK_RETRY_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        os.close(fd)
        raise ConfigError(_WHERE, f"cannot lock {path}: {exc.strerror or exc}") from exc
    except BaseException:
        os.close(fd)
        raise
    return CacheLock(path, fd)
