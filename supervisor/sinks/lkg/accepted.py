"""A follower's highest accepted statement and the root it is pinned to, kept across restarts."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from typing import Annotated, Final

import msgspec

from supervisor import reasons
from supervisor.bounds import OutOfRange, quoted
from supervisor.errors import ConfigError
from supervisor.reasons import ROLLBACK
from supervisor.sinks.atomic import write_atomic
from supervisor.sinks.lkg.errors import CacheError, unwritable
from supervisor.sinks.lkg.fileformat import decode_file
from supervisor.sinks.lkg.files import NotRegularFile, read_regular
from supervisor.sinks.lkg.keys import parse_trusted
from supervisor.sinks.lkg.statement import Statement, utc_times

__all__ = ["ACCEPTED_SUFFIX", "RESET_HINT", "AcceptedStatements", "refusal_of", "supersedes",
           "write_reset"]

#: How an operator moves a follower to another root, or below a sequence it holds.
RESET_HINT: Final = ("`trio-supervisor follower reset --config FILE` forgets it (or "
                     "[control_plane].root_identity names the root to follow)")

ACCEPTED_SUFFIX: Final = ".accepted"
_MAX_BYTES: Final = 4096


class _Record(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    revision: Annotated[int, msgspec.Meta(ge=0)]
    body_sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    sequence: Annotated[int, msgspec.Meta(ge=0)]
    root: str
    issued_at: datetime
    expires_at: datetime


class _Reset(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What ``follower reset`` leaves: nothing accepted, no root pinned, no restore."""

    reset_at: datetime


def refusal_of(candidate: Statement, highest: Statement | None,
               root_identity: str | None = None) -> tuple[str, str] | None:
    """(reason, detail) when ``candidate`` may not be accepted after ``highest``; else None.

    Checked after the signature verified, before expiry. ``root_identity``
    (``[control_plane].root_identity``) pins the root in place of ``highest``'s.

    - Another root than the pinned one: ``denied``, naming both. A restored copy of
      the root's database (a DR drill, a staging clone) signing with the same key
      must not move the tree.
    - Same root, lower ``sequence``: ``rollback`` (a replay, or a root whose count
      went back).
    - Same ``sequence``, another revision or body: ``corrupt`` (a forger or a broken root).
    - The same intent issued earlier is no refusal: a sibling root signed it
      (see :func:`supersedes`).
    """
    pinned = root_identity if root_identity is not None else (
        highest.root if highest is not None else None)
    if pinned is not None and candidate.root != pinned:
        source = ("[control_plane].root_identity" if root_identity is not None
                  else "the first statement it accepted")
        return (reasons.DENIED, f"a statement of root {quoted(candidate.root)}, but this "
                f"follower is pinned to root {quoted(pinned)} (by {source}): another control "
                f"plane signing with a trusted key; to follow the new root, {RESET_HINT}")
    if highest is None or candidate.root != highest.root:
        return None  # the first statement, or the first of the root named by root_identity
    if candidate.sequence < highest.sequence:
        return (ROLLBACK, f"sequence {candidate.sequence} (revision {candidate.revision}) of "
                f"root {quoted(candidate.root)} is below sequence {highest.sequence} "
                f"(revision {highest.revision}) already accepted: a replayed statement, or "
                f"a root whose count went back; if the root will never reach "
                f"{highest.sequence} again, {RESET_HINT}")
    if candidate.sequence == highest.sequence:
        if (candidate.revision, candidate.body_sha256) != (highest.revision,
                                                            highest.body_sha256):
            return (reasons.CORRUPT, f"sequence {candidate.sequence} names revision "
                    f"{candidate.revision} (sha256 {candidate.body_sha256[:12]}), but revision "
                    f"{highest.revision} (sha256 {highest.body_sha256[:12]}) was accepted "
                    "under the same sequence")
    return None


def supersedes(candidate: Statement, highest: Statement | None) -> bool:
    """Whether an accepted ``candidate`` replaces ``highest``: another root, a higher
    sequence, or the same intent expiring later (of two siblings, the later-expiring)."""
    if highest is None or candidate.root != highest.root:
        return True
    if candidate.sequence != highest.sequence:
        return candidate.sequence > highest.sequence
    return (candidate.expires_at, candidate.issued_at) > (highest.expires_at, highest.issued_at)


def write_reset(path: str) -> None:
    """Replace the accepted file at ``path`` with a reset record (``follower reset``)."""
    record = _Reset(datetime.now(UTC))
    write_atomic(path, msgspec.json.encode(record) + b"\n", mode=0o600)


class AcceptedStatements:
    """The highest accepted statement, in memory and (``path`` set) on disk.

    ``<cache path>.accepted`` (:data:`ACCEPTED_SUFFIX`) holds it as one JSON object,
    without its signature (verified when accepted), replaced atomically and fsynced.
    Its ``root`` pins this follower to a root, as TUF pins its root. The first accepted
    statement sets it; ``follower reset`` clears it (:func:`write_reset`).

    The daemon keeps it, not the convergence child: neither a child crash nor a
    restart forgets it. A failed write is retried at every :meth:`sync`.

    A missing file means nothing accepted yet, unless :meth:`restore_from` finds a
    forwarded statement. A file that cannot be read or decoded refuses to start
    (ConfigError naming it): rollback protection is never silently dropped.

    Blocking file I/O: call from a worker thread.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        #: The highest accepted statement (None: nothing accepted yet).
        self.highest: Statement | None = None
        #: A reset record is on disk: nothing accepted, and nothing is restored.
        self.reset = False
        # The file as last read or written (inode, mtime, size); another: someone reset it.
        self._seen: tuple[int, int, int] | None = None
        #: Whether the file holds what is in memory (False after a failed write).
        self.durable = True
        self._lock = threading.Lock()
        if path is not None:
            self.highest = self._read(path)

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self, path: str) -> Statement | None:
        where = "$.cache.path"
        reset = (f"`trio-supervisor follower reset` (or removing {path}) resets the "
                 "follower's rollback protection deliberately")
        self._seen = self._stat()
        try:
            raw = read_regular(path, limit=_MAX_BYTES)
        except NotRegularFile as exc:
            raise ConfigError(where, f"{path} is {exc.kind}, not a regular file; {reset}") from None
        except OSError as exc:
            raise ConfigError(where, f"{path} cannot be read: {exc.strerror or exc}") from exc
        if raw is None:
            return None
        try:
            record = msgspec.json.decode(raw, type=_Record)
        except msgspec.DecodeError as exc:
            try:
                msgspec.json.decode(raw, type=_Reset)
            except msgspec.DecodeError:
                raise ConfigError(where, f"{path} is not an accepted statement ({exc}); "
                                  f"{reset}") from exc
            self.reset = True
            return None
        try:
            issued_at, expires_at = utc_times(record.issued_at, record.expires_at)
        except OutOfRange as exc:
            raise ConfigError(where, f"{path} is not an accepted statement ({exc}); "
                              f"{reset}") from None
        self.reset = False
        return Statement(record.revision, record.body_sha256, record.sequence, record.root,
                         issued_at, expires_at)

    def sync(self) -> bool:
        """At every poll: take a reset written meanwhile, or write again a failed write.

        True when the file was read again (changed by someone else: a reset). A file
        removed, or changed into something unreadable, is written again from memory. Raises
        CacheUnwritable as :meth:`accept` when the write fails.
        """
        if self.path is None:
            return False
        with self._lock:
            now = self._stat()
            if now is not None and now != self._seen:
                try:
                    self.highest = self._read(self.path)
                except ConfigError:
                    self.durable = False  # overwritten below from memory
                else:
                    self.durable = True
                    return True
            if (now is None or not self.durable) and self.highest is not None:
                self._write(self.highest)
            return False

    def restore_from(self, signed_path: str, trusted_keys: list[str], *,
                     limit: int, root_identity: str | None = None) -> Statement | None:
        """The statement of the root's signed file at ``signed_path``, when it supersedes.

        The file a follower passes on holds a statement it accepted, so it is a floor for
        the highest. It matters when the accepted file was deleted, lost in a restore, or
        not written on a full disk. Verified against ``trusted_keys``; a missing, unreadable
        or refused file, one of another root than the pinned one (``root_identity`` in place
        of the highest's, as :func:`refusal_of`), or a reset record restores nothing
        (None). Made the highest (and written) when restored; raises CacheUnwritable as
        :meth:`accept`.
        """
        if self.reset:
            return None
        try:
            data = read_regular(signed_path, limit=limit)
            if data is None:
                return None
            header, _ = decode_file(data, signed_path, parse_trusted(trusted_keys))
        except (NotRegularFile, OSError, CacheError, ConfigError):
            return None
        statement = header.statement()
        if statement is None or refusal_of(statement, self.highest, root_identity) or (
                not supersedes(statement, self.highest)):
            return None
        self.accept(statement)
        return statement

    def accept(self, statement: Statement) -> None:
        """Make ``statement`` the highest: durably first, then in memory.

        Raises :class:`~supervisor.sinks.lkg.errors.CacheUnwritable` when the file cannot be
        written. The statement is held in memory anyway, so this process still refuses what
        it would have. :meth:`sync` writes again at the next poll.
        """
        with self._lock:
            self.highest = statement.without_bytes()
            self.reset = False
            if self.path is not None:
                self._write(self.highest)

    def _write(self, statement: Statement) -> None:
        assert self.path is not None
        record = _Record(statement.revision, statement.body_sha256, statement.sequence,
                         statement.root, statement.issued_at, statement.expires_at)
        self.durable = False
        with unwritable(self.path, "the highest accepted statement could not be written"):
            write_atomic(self.path, msgspec.json.encode(record) + b"\n", mode=0o600)
        self.durable = True
        self._seen = self._stat()
