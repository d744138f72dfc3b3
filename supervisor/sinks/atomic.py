"""Durable, atomic replacement of a small file: :func:`write_atomic`.

The one way this package writes a file read back whole: the cache, its mark, the snapshot file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile

from supervisor.logs import get_logger

__all__ = ["directory_mode", "fsync_directory", "write_atomic"]

log = get_logger("sinks")


def directory_mode(path: str) -> int | None:
    """The permission bits of the directory ``path`` is in; None when that is no directory now."""
    try:
        st = os.stat(os.path.dirname(path) or ".")
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISDIR(st.st_mode) else None


def write_atomic(path: str, data: bytes, *, mode: int = 0o600,
                 directory_mode: int | None = None) -> os.stat_result:
    """Replace ``path`` with ``data`` atomically and durably.

    After it returns, ``path`` holds exactly ``data`` with permission bits ``mode``, and
    survives a power loss. If it raises, ``path`` holds what it held before (old content, or
    nothing) and no temporary file is left. Readers never see a partial file. The data goes
    to a temporary file in the *same directory*, then is renamed over the target
    (``os.replace`` is atomic within one file system only).

    Errors are the system's ``OSError``, unchanged; each caller maps it to its own
    refusal (the cache raises ``CacheUnwritable``).

    ``directory_mode`` (from :func:`directory_mode` at start): a missing directory
    (a tmpfiles cleaner, an operator) is made again with exactly that mode. Only that
    directory: a missing parent is more likely an unmounted volume. Logged as
    ``made a missing sink directory again``.

    Returns the file's status before the rename (device, inode, size and mtime
    survive it). Callers compare it later to notice the file replaced, without the
    race a ``stat`` after the rename would have.
    """
    try:
        return _replace(path, data, mode)
    except FileNotFoundError as missing:
        if directory_mode is None:
            raise
        try:
            _remake_directory(path, directory_mode)
        except OSError as exc:
            # mkdir's own error says why the directory is missing still (a
            # full disk, a missing parent), where the write's named only a file.
            raise exc from missing
    return _replace(path, data, mode)


def _remake_directory(path: str, mode: int) -> None:
    """Make ``path``'s missing directory with ``mode``; raises mkdir's error when it cannot be."""
    directory = os.path.dirname(path) or "."
    try:
        os.mkdir(directory, mode)
    except FileExistsError:
        return  # made meanwhile (by whoever removed it?): write into it
    # mkdir's mode is narrowed by the umask: the recorded mode is the contract.
    os.chmod(directory, mode)
    fsync_directory(os.path.dirname(os.path.abspath(directory)))
    log.info("made a missing sink directory again", path=directory, mode=f"{mode:04o}")


def _replace(path: str, data: bytes, mode: int) -> os.stat_result:
    directory = os.path.dirname(path) or "."
    base = os.path.basename(path)
    # mkstemp creates the file 0600 and O_EXCL, so nobody else can open it
    # between creation and the chmod below; the leading dot keeps it out of
    # casual directory listings and globs like "*.json".
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
    try:
        try:
            # fchmod rather than relying on the umask: the mode is part of the
            # contract (a cache or key file must not become group-readable).
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            # Without this fsync a crash after the rename can leave an empty
            # or partial file under the final name (ext4 delalloc, xfs).
            os.fsync(fd)
            status = os.fstat(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # BaseException, not Exception: a KeyboardInterrupt or a trio
        # cancellation delivered in the middle must not leave the temp file.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(directory)
    return status


def fsync_directory(directory: str) -> None:
    """Make the rename itself durable: it lives in the directory's entries."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some file systems (certain FUSE and network mounts) refuse fsync on
        # a directory. The rename has happened and there is nothing stronger
        # to do there, so that one refusal is not a failed write.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)
