"""The signed last-known-good cache: :class:`LastKnownGood` and the order of its writes.

Operators: docs/operations.md, "Cache files and rollback protection" and "Cache key rotation".
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from supervisor import reasons
from supervisor.errors import ConfigError
from supervisor.sinks.lkg.errors import CacheError, CacheUnwritable, unwritable
from supervisor.sinks.lkg.fileformat import (
    MAGIC,
    MAX_HEADER_BYTES,
    decode_file,
    encode_file,
    encode_header,
    peek_digest,
    peek_revision,
)
from supervisor.sinks.lkg.files import (
    CacheFiles,
    DurableFiles,
    NotRegularFile,
    prepare_directory,
    read_regular,
)
from supervisor.sinks.lkg.keys import key_id_of, load_signing_key, parse_trusted
from supervisor.sinks.lkg.mark import SERVED_SUFFIX, ServedMark, check_revision
from supervisor.sinks.lkg.statement import Statement

__all__ = ["SERVED_SUFFIX", "CacheFiles", "CachedRevision", "LastKnownGood"]

_PEEK_BYTES: Final = len(MAGIC) + 4 + MAX_HEADER_BYTES


# --------------------------------------------------------------------------- the cache


@dataclass(frozen=True)
class CachedRevision:
    """A verified revision read from the cache."""

    revision: int
    generation: int
    schema_version: int
    created_at: datetime
    body: bytes = field(repr=False)
    key_id: str
    _clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC), repr=False,
                                           compare=False)
    #: The signed statement it carries (format_version 2; None for a version 1 file).
    statement: Statement | None = None
    #: The body's SHA-256, as the signed header states it and the load verified.
    body_sha256: bytes = b""

    @property
    def age_s(self) -> float:
        """Seconds since it was exported, by the cache's clock; 0 if that clock is behind."""
        return max(0.0, (self._clock() - self.created_at).total_seconds())


class LastKnownGood:
    """One replica's signed cache file and its served-revision mark.

    A replica exports every revision it publishes (:meth:`export`). At boot, when the
    control plane is unreachable or holds a revision this build cannot read, it may
    serve that file instead (:meth:`load`).
    The cache is this deployment's statement "revision N was good". So it is signed,
    and refused whenever it cannot be trusted. It never expires by age: an outage is
    exactly when it is needed. :attr:`CachedRevision.age_s` shows the age.

    Invariant: at every instant a process can stop, a cache file never exists
    without a mark, and the mark is <= the cached revision. :meth:`export` keeps it
    by the order of its two atomic writes (see there), given that it held before.
    A deleted mark refuses the cache until reset (:class:`~.mark.ServedMark`).

    The constructor creates a missing cache directory (0700, parents too). It records the
    mode for :class:`~.files.DurableFiles`, which remakes a directory removed while running.
    It refuses unsafe ownership or modes as ConfigError (:func:`~.files.prepare_directory`),
    and loads the signing key now, so ``check`` and boot report a bad key.

    Every method but the properties blocks (file I/O, fsync), the constructor included:
    call them from a worker thread under trio. They are thread-safe.
    """

    def __init__(
        self,
        path: str,
        *,
        signing_key_path: str | None,
        trusted_keys: Sequence[str],
        max_schema_version: int,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        files: CacheFiles | None = None,
    ) -> None:
        self._path = path
        self._trusted = parse_trusted(trusted_keys)
        # Loaded now, not at the first export: a bad key is a configuration
        # error that `check` and boot should report, not a silent export failure.
        self._signing_key = (
            load_signing_key(signing_key_path) if signing_key_path is not None else None
        )
        self.signing_key_id: str | None = None
        self.signing_key_trusted = False
        if self._signing_key is not None:
            verify = self._signing_key.verify_key
            self.signing_key_id = key_id_of(verify)
            known = self._trusted.get(self.signing_key_id)
            # Exports signed by an untrusted key would be refused ("denied") at
            # the next boot: the caller warns when this is False.
            self.signing_key_trusted = known is not None and bytes(known) == bytes(verify)
        prepare_directory(os.path.dirname(path), (path, path + SERVED_SUFFIX))
        # After prepare_directory: the mode recorded is the one it checked.
        self._files: CacheFiles = (files if files is not None
                                   else DurableFiles.for_directory_of(path))
        # Locked by this object's lock, as the cache file is.
        self._mark = ServedMark(path, self._files)
        self._max_schema_version = max_schema_version
        self._clock = clock
        self._lock = threading.Lock()

    @property
    def paths(self) -> tuple[str, str]:
        """The cache file and its served mark: the two files an export writes."""
        return (self._path, self._mark.path)

    def forget_files(self) -> None:
        """The files were changed by someone else: re-read the mark before the next write.

        The mark is otherwise read once and rewritten only when its value changes. So a mark
        deleted or garbled under a running daemon would survive an export of the same
        revision. What this process noted as served is kept (a deleted mark never lowers
        it).
        """
        with self._lock:
            self._mark.forget_file()

    @property
    def path(self) -> str:
        return self._path

    @property
    def trusted_key_ids(self) -> tuple[str, ...]:
        return tuple(self._trusted)

    def refuse_own_key_among(self, trusted_keys: Sequence[str], where: str) -> None:
        """ConfigError at ``where`` when this cache's signing key is in ``trusted_keys``.

        A follower's upstream keys must be the root's. Trusting its own cache key there
        would let anyone holding that key forge statements for it: this replica, or every
        replica of a fleet sharing one key list.
        """
        upstream = parse_trusted(trusted_keys, where_key=where)
        if self.signing_key_id is not None and self.signing_key_id in upstream:
            raise ConfigError(where, f"holds this replica's own cache verify key (key id "
                              f"{self.signing_key_id}, [cache].signing_key): name the root's "
                              "verify keys only")

    # ----------------------------------------------------------------- the mark

    def note_served(self, revision: int) -> None:
        """Record that this replica served ``revision`` (>= 1): raise the mark to it if below.

        Raises :class:`CacheUnwritable` when the mark file cannot be written;
        the mark is raised in memory regardless, and the write is retried by
        the next call.
        """
        check_revision(revision)
        with self._lock:
            self._mark.raise_to(revision)

    # ----------------------------------------------------------------- export

    def export(self, *, revision: int, generation: int, schema_version: int, body: bytes,
               statement: Statement | None = None, body_sha256: bytes = b"") -> None:
        """Sign and durably write ``body`` as the cache; set the served mark to ``revision``.

        With ``statement`` the file is format_version 2 and signs it; without, version 1.
        The statement must name ``revision`` and ``body``'s digest (ValueError otherwise).
        ``body_sha256`` is the digest the caller already verified: it is not hashed again.

        ``revision`` is a control-plane id (>= 1); ``generation`` and ``schema_version``
        are >= 0 (ValueError otherwise, nothing written). Raises :class:`CacheUnwritable`
        (``OSError`` chained) when a file cannot be written or no signing key is set.

        The mark is *set*, not only raised (:mod:`~supervisor.sinks.lkg.mark` says why).
        The writes are ordered to keep the class invariant:

        - mark missing, 0 or garbled: mark first, then cache. A stop between leaves a
          mark and no new cache (on a first export: nothing to serve, nothing refused);
        - revision rises: cache first, then mark. A stop leaves mark < cache;
        - revision falls: mark first, then cache. A stop leaves the lower mark beside the
          newer cache, which still loads. If the export fails, the caller runs
          :meth:`discard_if_newer`, so the next boot cannot serve the abandoned revision.

        Blocking.
        """
        check_revision(revision)
        for name, value in (("generation", generation), ("schema_version", schema_version)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        digest = body_sha256.hex() or hashlib.sha256(body).hexdigest()
        if statement is not None and (
                statement.revision != revision or statement.body_sha256 != digest):
            raise ValueError("the statement is about another revision or body")
        if self._signing_key is None or self.signing_key_id is None:
            raise CacheUnwritable(self._path, "no signing key is configured ($.cache.signing_key)")
        header = encode_header(
            statement=statement,
            revision=revision,
            generation=generation,
            schema_version=schema_version,
            created_at=self._clock(),
            body=body,
            key_id=self.signing_key_id,
            body_sha256=digest,
        )
        data = encode_file(header, body, self._signing_key)
        with self._lock:
            mark = self._mark
            known = mark.known()
            if mark.absent or revision < known:
                # Mark first: a cache never exists without a mark, and a
                # lowered mark is never above the cache a stop leaves behind.
                mark.write(revision)
                mark.value = revision
                self._write_cache(data)
            else:
                # Cache first: a raised mark is never above the cached revision.
                self._write_cache(data)
                mark.value = revision
                mark.write(revision)

    def _write_cache(self, data: bytes) -> None:
        with unwritable(self._path, "the cache could not be written"):
            self._files.write(self._path, data, mode=0o600)

    # ----------------------------------------------------------------- discard

    def cached_revision(self) -> int | None:
        """The revision the cache file's header names, UNVERIFIED; None when there is none.

        Cheap (reads the header only) and never raises: for logs and for
        :meth:`discard_if_newer`, never for serving (only :meth:`load` verifies).
        """
        prefix = self._peek()
        return None if prefix is None else peek_revision(prefix)

    def _peek(self) -> bytes | None:
        try:
            return read_regular(self._path, limit=_PEEK_BYTES)
        except (NotRegularFile, OSError):
            return None

    def discard_if_newer(self, revision: int, body_sha256: bytes | None = None) -> bool:
        """Remove the cache file when it holds a revision above ``revision``, or ``revision``
        itself with another body than ``body_sha256``; True when removed.

        For a rollback whose export failed (desired moved to an older revision; the disk is
        full), or an id that came back with another body (a restore from a backup, then a
        publish). The next boot must not serve the content moved away from. The mark is left
        as it is; unlink needs no disk space. A missing (or unreadable, or never servable)
        file is not removed and is no error. Raises :class:`CacheUnwritable` when the
        removal fails. Blocking.
        """
        if revision < 0:
            raise ValueError(f"revision must be >= 0, got {revision}")
        with self._lock:
            prefix = self._peek()
            held = None if prefix is None else peek_revision(prefix)
            if held is None or held < revision:
                return False
            if held == revision and (body_sha256 is None
                                     or peek_digest(prefix or b"") == body_sha256.hex()):
                return False
            with unwritable(self._path, f"the cache (revision {held}) could not be removed"):
                try:
                    self._files.remove(self._path)
                except FileNotFoundError:
                    return False
            return True

    # ----------------------------------------------------------------- load

    def load(self) -> CachedRevision | None:
        """The verified cached revision; None when there is no cache file.

        Raises :class:`CacheSkew` for a newer format (treat as no cache) and
        :class:`CacheError` for every other refusal.
        Labels (``CacheError.reason``), checked in order:

        ``corrupt``
            Not a regular file at the cache or mark path (FIFO, socket, device, directory,
            symlink; never read, so a FIFO cannot hang the boot). Also: unreadable, bad
            magic, truncated, header over the limit, an authentic but malformed header,
            or a body whose length or SHA-256 differs from the signed header. A digest
            mismatch is ``corrupt``, not ``denied``: the statement is authentic, the bytes
            are not the ones it vouches for (bit rot and tampering look the same).
            The control plane's ``corrupt`` means the same (docs/reasons.md).
        ``denied``
            The key id is not trusted, or the signature fails. An undecodable header is
            tried against every trusted key: no match is ``denied``, a match ``corrupt``.
        ``incompatible``
            :class:`CacheSkew` when ``format_version`` is newer than this build reads;
            plain :class:`CacheError` when ``schema_version`` exceeds ``max_schema_version``.
        ``rollback``
            ``revision`` is below the served mark, or the mark is missing or 0 beside a
            cache (``path`` is then the mark file). See :class:`~.mark.ServedMark`.

        ``unwritable`` (:class:`CacheUnwritable`) comes only from the write methods. Blocking.
        """
        try:
            data = read_regular(self._path)
        except NotRegularFile as exc:
            raise CacheError(
                reasons.CORRUPT,
                self._path,
                f"{exc.kind} is at the cache path, not a regular file; remove it (the next "
                f"export writes the cache again)",
            ) from None
        except OSError as exc:
            raise CacheError(
                reasons.CORRUPT, self._path, f"cannot be read: {exc.strerror or exc}"
            ) from exc
        if data is None:
            return None
        header, body = decode_file(data, self._path, self._trusted)
        if header.schema_version > self._max_schema_version:
            raise CacheError(
                reasons.INCOMPATIBLE,
                self._path,
                f"schema_version {header.schema_version} is newer than this build reads "
                f"({self._max_schema_version})",
                revision=header.revision,
            )
        with self._lock:
            # Strict here, unlike the write paths: a garbled or missing mark
            # refuses the cache instead of quietly disabling rollback protection.
            self._mark.refuse_rollback(header.revision)
        return CachedRevision(
            revision=header.revision,
            generation=header.generation,
            schema_version=header.schema_version,
            created_at=header.created_at,
            body=body,
            key_id=header.key_id,
            _clock=self._clock,
            statement=header.statement(),
            body_sha256=bytes.fromhex(header.body_sha256),
        )

