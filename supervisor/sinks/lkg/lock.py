"""One daemon per cache: an exclusive lock held beside ``[cache].path`` while a daemon runs.

Two daemons given one cache path would each rewrite the cache, its served
mark and the follower's forward file on every poll with their own revisions,
and a later boot would serve whichever wrote last. :func:`hold_cache_lock`
takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<cache path>.lock`` (created
0600, its directory 0700 when missing) and keeps the file open: the kernel
releases the lock when the process ends however it ends, so a crashed daemon
never leaves a stale lock behind. A second daemon is refused at start with a
:class:`~supervisor.errors.ConfigError` at ``$.cache.path`` naming the path
(exit 2).

A lock file that cannot be made at all (the cache's directory is a file,
read-only, or full) is not a reason to stop serving: the cache cannot be
written either, which the sinks report (``/status`` ``sinks.cache``), so
:func:`hold_cache_lock` returns None and the caller says it runs unlocked.
"""

from __future__ import annotations

import fcntl
import os
from typing import Final

from supervisor.errors import ConfigError

__all__ = ["LOCK_SUFFIX", "CacheLock", "hold_cache_lock"]

LOCK_SUFFIX: Final = ".lock"


class CacheLock:
    """The held lock; :meth:`release` (or the process ending) lets it go."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def hold_cache_lock(cache_path: str) -> CacheLock | None:
    """Lock ``cache_path`` for this process; ConfigError when another daemon holds it.

    None when the lock file cannot be made (see the module docstring).
    """
    path = cache_path + LOCK_SUFFIX
    where = "$.cache.path"
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(where, f"{cache_path} is in use by another daemon (it holds the "
                          f"lock {path}): one daemon per cache") from None
    except OSError as exc:
        os.close(fd)
        raise ConfigError(where, f"cannot lock {path}: {exc.strerror or exc}") from exc
    return CacheLock(path, fd)
