"""The served-revision mark: the highest revision this replica served, and the rollback refusal."""

from __future__ import annotations

import os
from typing import Final

from supervisor import reasons
from supervisor.sinks.lkg.errors import CacheError, unwritable
from supervisor.sinks.lkg.files import CacheFiles, NotRegularFile, read_regular

__all__ = ["SERVED_SUFFIX", "ServedMark", "check_revision"]

SERVED_SUFFIX: Final = ".served"
_MARK_BYTES: Final = 64  # a revision id is at most 20 digits


def check_revision(revision: int) -> None:
    """ValueError unless ``revision`` is a control-plane id (>= 1)."""
    # Control-plane ids start at 1; a mark of 0 means "no mark" on disk.
    if revision < 1:
        raise ValueError(f"revision must be >= 1, got {revision}")


class ServedMark:
    """The mark next to the cache at ``cache_path``, and the mark as this process knows it.

    ``<cache path>.served`` holds one decimal revision id, written atomically (0600).
    A cached revision below it is older than one this replica served: ``rollback``.
    ``note_served`` raises it (:meth:`raise_to`). An export *sets* it to the exported
    revision, because an operator may point desired state back at an older id. A mark
    that only rose would then refuse the replica's own current cache at the next boot.
    The order of mark and cache writes is LastKnownGood.export's.

    Deleting the mark does not defeat it: a cache with no mark, or a mark of 0, is
    ``rollback`` (ids start at 1). A garbled mark, or no regular file, is ``corrupt``.
    To trust such a cache, write its revision into the mark; the refusal names it.

    Strict for serving, lenient for writing. :meth:`refuse_rollback` reads the file every
    time. The write paths (:meth:`known`, :meth:`write`) read it once, count an unusable
    file as 0, and rewrite only on a change (no fsync per publish). :meth:`forget_file`
    makes them read again. :attr:`value` is the highest noted or read: a restart, or a
    mark deleted under a running replica, never lowers it.

    Blocking file I/O, and not locked: LastKnownGood holds its lock around every call.
    """

    def __init__(self, cache_path: str, files: CacheFiles) -> None:
        self.cache_path = cache_path
        self.path = cache_path + SERVED_SUFFIX
        self._files = files
        # The mark as this process knows it (max of what it noted and read),
        # and what the .served file is known to hold (None: not read yet;
        # 0: missing or 0; -1: unusable, rewritten by the next write).
        self.value = 0
        self._persisted: int | None = None

    @property
    def absent(self) -> bool:
        """The file is not known to hold a usable mark (missing, 0, garbled, or not read)."""
        return self._persisted is None or self._persisted <= 0

    def forget_file(self) -> None:
        """The file was changed by someone else: read it again before the next write."""
        self._persisted = None

    def read(self) -> int:
        """The .served file's value; 0 when missing; CacheError(corrupt) when unusable."""
        reset = f"write the cache's revision into {self.path} to reset it deliberately"
        try:
            raw = read_regular(self.path, limit=_MARK_BYTES)
        except NotRegularFile as exc:
            raise CacheError(
                reasons.CORRUPT,
                self.path,
                f"the served-revision mark is {exc.kind}, not a regular file; remove it and "
                f"{reset}",
            ) from None
        except OSError as exc:
            raise CacheError(
                reasons.CORRUPT,
                self.path,
                f"the served-revision mark cannot be read: {exc.strerror or exc}",
            ) from exc
        if raw is None:
            return 0
        text = raw.strip()
        if not text.isdigit() or len(text) > 20:
            raise CacheError(
                reasons.CORRUPT,
                self.path,
                f"the served-revision mark is not a revision id; {reset}",
            )
        return int(text)

    def known(self) -> int:
        """The mark for a write path: a garbled or unreadable file counts as 0 and is rewritten."""
        if self._persisted is None:
            try:
                self._persisted = self.read()
            except CacheError:
                self._persisted = -1  # never equal to a target: forces a rewrite
            # A fresh instance (a restart) must not lower what an earlier one served.
            self.value = max(self.value, self._persisted)
        return self.value

    def write(self, value: int) -> None:
        """Make the file hold ``value`` (not :attr:`value`); CacheUnwritable when it cannot."""
        if self._persisted == value:
            return  # no fsync per publish when nothing changed
        with unwritable(self.path, "the served-revision mark could not be written"):
            self._files.write(self.path, f"{value}\n".encode("ascii"), mode=0o600)
        self._persisted = value

    def raise_to(self, revision: int) -> None:
        """Raise the mark to ``revision`` if below, in memory even when the write fails."""
        target = max(self.known(), revision)
        self.value = target
        self.write(target)

    def refuse_rollback(self, revision: int) -> None:
        """CacheError(rollback) unless a cache of ``revision`` may be served.

        Strict, unlike the write paths: a garbled or missing mark refuses the
        cache (``corrupt``, ``rollback``) instead of quietly disabling rollback
        protection.
        """
        persisted = self.read()
        mark = max(self.value, persisted)
        if persisted <= 0:
            state = "0" if os.path.exists(self.path) else "missing"
            raise CacheError(
                reasons.ROLLBACK,
                self.path,
                f"the served-revision mark is {state} next to a cache of revision "
                f"{revision}, so whether that revision is "
                f"older than one this replica already served cannot be told (the mark may have "
                f"been deleted); to trust this cache deliberately, write its revision into the "
                f"mark: echo {revision} > {self.path}",
                revision=revision,
            )
        if revision < mark:
            raise CacheError(
                reasons.ROLLBACK,
                self.cache_path,
                f"revision {revision} is older than revision {mark}, which this "
                f"replica already served",
                revision=revision,
            )
