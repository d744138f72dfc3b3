"""A follower's highest accepted statement: its rollback protection, kept across restarts.

``<cache path>.accepted`` (:data:`ACCEPTED_SUFFIX`) holds the statement
(:mod:`~supervisor.sinks.lkg.statement`, without its signature: it was
verified when accepted) of the highest root intent this follower ever
accepted, as one JSON object, replaced atomically and fsynced before the
statement it names is served. It is read when the daemon starts and kept in
memory by the daemon, not by the convergence child, so neither a crash of the
child nor a restart of the process forgets it.

:func:`refusal_of` is the rule a candidate statement must pass against it
(after its signature verified, before its expiry is looked at):

* another root identity (the root's control plane was restored from a backup,
  or replaced): accepted only when issued after the highest accepted
  statement, so a replay of anything the old root ever signed stays refused,
  while the new root's sequence (which may restart lower) starts a new count;
* the same root: a lower ``sequence`` is ``rollback`` (a replay of an older
  statement); the same ``sequence`` naming another revision or body is
  ``corrupt`` (one intent, two contents: a forger or a broken root); the same
  intent issued before the one held is ``rollback`` (a replay of an earlier
  refresh, which would make the tree look fresher than it is).

Missing file: nothing accepted yet (a first start), unless this follower has
passed a statement on: :meth:`AcceptedStatements.restore_from` then takes the
root's signed bytes it forwards (verified again) as the highest, so a deleted
file does not silently drop the protection (to reset it deliberately, remove
both files). A file that cannot be
read or decoded refuses to start (:class:`~supervisor.errors.ConfigError`
naming it): silently dropping rollback protection is never the answer; remove
the file to reset it deliberately. Blocking file I/O: call from a worker thread.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Annotated, Final

import msgspec

from supervisor import reasons
from supervisor.errors import ConfigError
from supervisor.sinks.atomic import write_atomic
from supervisor.sinks.lkg.errors import ROLLBACK, CacheError, CacheUnwritable
from supervisor.sinks.lkg.fileformat import decode_file
from supervisor.sinks.lkg.files import NotRegularFile, read_regular
from supervisor.sinks.lkg.keys import parse_trusted
from supervisor.sinks.lkg.statement import Statement

__all__ = ["ACCEPTED_SUFFIX", "AcceptedStatements", "refusal_of"]

ACCEPTED_SUFFIX: Final = ".accepted"
_MAX_BYTES: Final = 4096


class _Record(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    revision: Annotated[int, msgspec.Meta(ge=0)]
    body_sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    sequence: Annotated[int, msgspec.Meta(ge=0)]
    root: str
    issued_at: datetime
    expires_at: datetime


def refusal_of(candidate: Statement, highest: Statement | None) -> tuple[str, str] | None:
    """(reason, detail) when ``candidate`` may not be accepted after ``highest``; else None."""
    if highest is None:
        return None
    if candidate.root != highest.root:
        if candidate.issued_at > highest.issued_at:
            return None
        return (ROLLBACK, f"a statement of root {candidate.root!r} issued at "
                f"{candidate.issued_at.isoformat()}, not after the statement of root "
                f"{highest.root!r} already accepted (issued at {highest.issued_at.isoformat()})")
    if candidate.sequence < highest.sequence:
        return (ROLLBACK, f"sequence {candidate.sequence} (revision {candidate.revision}) is "
                f"below sequence {highest.sequence} (revision {highest.revision}) already "
                "accepted: a replayed statement")
    if candidate.sequence == highest.sequence:
        if (candidate.revision, candidate.body_sha256) != (highest.revision,
                                                            highest.body_sha256):
            return (reasons.CORRUPT, f"sequence {candidate.sequence} names revision "
                    f"{candidate.revision} (sha256 {candidate.body_sha256[:12]}), but revision "
                    f"{highest.revision} (sha256 {highest.body_sha256[:12]}) was accepted "
                    "under the same sequence")
        if candidate.issued_at < highest.issued_at:
            return (ROLLBACK, f"sequence {candidate.sequence} issued at "
                    f"{candidate.issued_at.isoformat()}, before the refresh already accepted "
                    f"(issued at {highest.issued_at.isoformat()}): a replayed statement")
    return None


class AcceptedStatements:
    """The highest accepted statement, in memory and (``path`` set) on disk (module docstring)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._highest: Statement | None = None
        self._lock = threading.Lock()
        if path is not None:
            self._highest = self._read(path)

    @property
    def highest(self) -> Statement | None:
        return self._highest

    @staticmethod
    def _read(path: str) -> Statement | None:
        where = "$.cache.path"
        reset = (f"remove {path} (and the statement passed on, beside it) to reset the "
                 "follower's rollback protection deliberately")
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
            raise ConfigError(where, f"{path} is not an accepted statement ({exc}); {reset}"
                              ) from exc
        return Statement(record.revision, record.body_sha256, record.sequence, record.root,
                         record.issued_at, record.expires_at)

    def restore_from(self, signed_path: str, trusted_keys: list[str], *,
                     limit: int) -> Statement | None:
        """With nothing accepted: the statement of the root's signed file at ``signed_path``.

        The file a follower passes on holds a statement it accepted, so it is a
        floor for the highest (the accepted file deleted, or lost to a disk
        restored without it). Verified against ``trusted_keys``; a missing,
        unreadable or refused file restores nothing (None). Made the highest
        (and written) when restored; raises CacheUnwritable as :meth:`accept`.
        """
        if self._highest is not None:
            return None
        try:
            data = read_regular(signed_path, limit=limit)
            if data is None:
                return None
            header, _ = decode_file(data, signed_path, parse_trusted(trusted_keys))
        except (NotRegularFile, OSError, CacheError, ConfigError):
            return None
        statement = header.statement()
        if statement is not None:
            self.accept(statement)
        return statement

    def accept(self, statement: Statement) -> None:
        """Make ``statement`` the highest: durably first, then in memory.

        Raises :class:`~supervisor.sinks.lkg.errors.CacheUnwritable` when the
        file cannot be written; the statement is then held in memory anyway
        (this process still refuses what it would have refused), and the next
        accept writes again.
        """
        with self._lock:
            self._highest = statement.without_bytes()
            if self.path is None:
                return
            record = _Record(statement.revision, statement.body_sha256, statement.sequence,
                             statement.root, statement.issued_at, statement.expires_at)
            try:
                write_atomic(self.path, msgspec.json.encode(record) + b"\n", mode=0o600)
            except OSError as exc:
                raise CacheUnwritable(self.path, "the highest accepted statement could not be "
                                      f"written: {exc.strerror or exc}") from exc
