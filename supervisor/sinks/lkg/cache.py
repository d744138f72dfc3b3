"""The signed last-known-good cache: one replica's cache file and its served-revision mark.

What it is for
--------------
A replica writes every revision it publishes to a local file (:meth:`LastKnownGood.export`).
When it boots and the control plane is unreachable, or holds a revision this
build cannot read, it may serve that file instead (:meth:`LastKnownGood.load`).
The cache is a *statement by this deployment* ("revision N was good"), so it is
signed (:mod:`~supervisor.sinks.lkg.fileformat`, :mod:`~supervisor.sinks.lkg.keys`),
and it is refused rather than served whenever it cannot be trusted.
It is never expired by age (an outage is exactly when it is needed):
:attr:`CachedRevision.age_s` reports the age so the caller can show it.

Refusals (``CacheError.reason``), checked in this order
--------------------------------------------------------
``corrupt``
    Anything at the cache path (or the mark path) that is not a regular file: a
    FIFO, socket, device, directory or symbolic link, named in the detail (it is
    never read, so a FIFO cannot hang the boot). Unreadable file, bad magic,
    truncation, a header length over the limit, a validly signed header that is
    malformed, or a body whose length or SHA-256 differs from the signed header.
    A body digest mismatch is ``corrupt`` and not ``denied`` on purpose: the
    signed statement itself is authentic, the bytes it vouches for are not those
    bytes (bit rot or tampering look the same), exactly the control plane's
    ``corrupt`` (docs/reasons.md).
``denied``
    The header names a key id not in ``trusted_keys``, or the signature does
    not verify (any altered header byte ends here). When the header is not even
    decodable, every trusted key is tried: no match is ``denied``, a match
    means an authentic but malformed header, ``corrupt``.
``incompatible``
    As :class:`CacheSkew` when the (authentic) ``format_version`` is newer
    than this build reads: the caller reports it and treats it as no cache. As
    plain :class:`CacheError` when ``schema_version`` is above
    ``max_schema_version``.
``rollback``
    ``revision`` is below this replica's served-revision mark, or the mark is
    missing or 0 next to an existing cache (``path`` is then the mark file).
``unwritable``
    Only from :meth:`~LastKnownGood.export`, :meth:`~LastKnownGood.note_served`
    and :meth:`~LastKnownGood.discard_if_newer` (:class:`CacheUnwritable`, the
    ``OSError`` chained).

Rollback protection
-------------------
``<path>.served`` holds one decimal revision id: the served-revision mark
(:mod:`~supervisor.sinks.lkg.mark`: its file, why an export *sets* it rather
than only raising it, why a missing or garbled mark refuses the cache).
:meth:`~LastKnownGood.note_served` raises it; :meth:`~LastKnownGood.export`
sets it to the exported revision, which is what this replica serves from then
on; :meth:`~LastKnownGood.load` refuses a cache below it.

The invariant: **at every instant a process can be stopped, a cache file never
exists without a mark, and the mark is <= the cached revision** (given that it
held before; a replica whose mark was deleted is refused until reset, as the
mark's module says).
:meth:`~LastKnownGood.export` keeps it by ordering its two atomic writes:

- the mark is missing (or 0, or garbled): mark first, then the cache, so a
  stop between them leaves a mark and no new cache (the first export leaves a
  mark and no cache at all: nothing to serve, nothing refused);
- the revision rises: cache first, then the mark (a stop leaves mark < cache);
- the revision falls: mark first, then the cache (a stop leaves the lower mark
  next to the newer cache, which still loads; when the export fails instead,
  :meth:`~LastKnownGood.discard_if_newer` removes that newer cache so that the
  next boot cannot serve the revision the operator moved away from).

Files and their owners
----------------------
The constructor creates a missing cache directory (0700, parents too), and
records its mode: a directory removed while running is made again, with that
mode, by the next write (:class:`~supervisor.sinks.lkg.files.DurableFiles`). It
refuses, as :class:`~supervisor.errors.ConfigError` at ``$.cache.path``, a
directory or an existing cache or mark file that is not owned by the effective
uid or is group- or world-writable (:mod:`supervisor.sinks.lkg.files`).

Every method but the properties blocks (file I/O and fsync), the constructor
included (it may create the directory): call them from a worker thread under
trio. They are safe to call from several threads.
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
from supervisor.sinks.lkg.errors import CacheError, CacheUnwritable
from supervisor.sinks.lkg.fileformat import (
    MAGIC,
    MAX_HEADER_BYTES,
    decode_file,
    encode_file,
    encode_header,
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
    """One replica's signed cache file and its served-revision mark (module docstring)."""

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

        The mark is otherwise read once and rewritten only when its value
        changes, so a mark deleted or garbled under a running daemon would not
        be written again by an export of the same revision. What this process
        noted as served is kept (a deleted mark never lowers it).
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

        A follower's upstream keys must be the root's: trusting its own cache
        key there would let anyone holding that key (this replica, or every
        replica of a fleet sharing one key list) forge statements for it.
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

        With ``statement`` the file is format_version 2 and signs it (its
        revision and digest must be ``revision``'s and ``body``'s: ValueError
        otherwise); without, version 1. ``body_sha256`` is the body's digest where the
        caller verified it (the control plane's read did): then it is not hashed again.

        ``revision`` is a control-plane id (>= 1); ``generation`` and
        ``schema_version`` are >= 0 (ValueError otherwise, nothing written).
        Raises :class:`CacheUnwritable` (``OSError`` chained) when either file
        cannot be written, or when no signing key is configured; the two
        writes are ordered as the module docstring says. Blocking.
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
        try:
            self._files.write(self._path, data, mode=0o600)
        except OSError as exc:
            raise CacheUnwritable(
                self._path, f"the cache could not be written: {exc.strerror or exc}"
            ) from exc

    # ----------------------------------------------------------------- discard

    def cached_revision(self) -> int | None:
        """The revision the cache file's header names, UNVERIFIED; None when there is none.

        Cheap (reads the header only) and never raises: for logs and for
        :meth:`discard_if_newer`, never for serving (only :meth:`load` verifies).
        """
        try:
            prefix = read_regular(self._path, limit=_PEEK_BYTES)
        except (NotRegularFile, OSError):
            return None
        return None if prefix is None else peek_revision(prefix)

    def discard_if_newer(self, revision: int) -> bool:
        """Remove the cache file when it holds a revision above ``revision``; True when removed.

        For a rollback whose export failed (desired moved to an older revision,
        the disk is full): the newer cache must not be served by the next boot.
        The mark is left as it is; unlink needs no disk space. A missing (or
        unreadable, or never servable) file is not removed and is no error.
        Raises :class:`CacheUnwritable` when the removal fails. Blocking.
        """
        if revision < 0:
            raise ValueError(f"revision must be >= 0, got {revision}")
        with self._lock:
            held = self.cached_revision()
            if held is None or held <= revision:
                return False
            try:
                self._files.remove(self._path)
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise CacheUnwritable(
                    self._path,
                    f"the cache (revision {held}) could not be removed: {exc.strerror or exc}",
                ) from exc
            return True

    # ----------------------------------------------------------------- load

    def load(self) -> CachedRevision | None:
        """The verified cached revision; None when there is no cache file.

        Raises :class:`CacheSkew` for a newer format (treat as no cache) and
        :class:`CacheError` for every other refusal. Blocking.
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

