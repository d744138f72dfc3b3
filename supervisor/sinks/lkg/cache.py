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
    Unreadable file, bad magic, truncation, a header length over the limit, a
    validly signed header that is malformed, or a body whose length or SHA-256
    differs from the signed header. A body digest mismatch is ``corrupt`` and
    not ``denied`` on purpose: the signed statement itself is authentic, the
    bytes it vouches for are not those bytes (bit rot or tampering look the
    same), exactly the control plane's ``corrupt`` (CONTRACT.md section 4).
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
    ``revision`` is below this replica's served-revision mark.
``unwritable``
    Only from :meth:`~LastKnownGood.export` and :meth:`~LastKnownGood.note_served`
    (:class:`CacheUnwritable`, the ``OSError`` chained).

Rollback protection
-------------------
``<path>.served`` holds one decimal revision id, written atomically (0600): the
served-revision mark. :meth:`~LastKnownGood.note_served` raises it;
:meth:`~LastKnownGood.export` sets it to the exported revision, which is what
this replica serves from then on. ``export`` *sets* rather than only raises
because an operator may point desired state back at an older revision id; a
mark that only rose would then make the replica refuse its own, current cache
at the next boot, during an outage, when it is needed. Writes are ordered so
that a crash between the two files never leaves the mark above the cache: when
the mark rises the cache is written first, when it falls the mark is. A missing
mark file is mark 0; a garbled one makes :meth:`~LastKnownGood.load` refuse
(``corrupt``, naming the ``.served`` file: delete it to reset) rather than
silently dropping the protection.

:meth:`~LastKnownGood.export`, :meth:`~LastKnownGood.load` and
:meth:`~LastKnownGood.note_served` block (file I/O and fsync): call them from a
worker thread under trio. They are safe to call from several threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from supervisor import reasons
from supervisor.sinks.atomic import write_atomic
from supervisor.sinks.lkg.errors import ROLLBACK, CacheError, CacheUnwritable
from supervisor.sinks.lkg.fileformat import decode_file, encode_file, encode_header
from supervisor.sinks.lkg.keys import key_id_of, load_signing_key, parse_trusted

__all__ = ["SERVED_SUFFIX", "CachedRevision", "LastKnownGood"]

SERVED_SUFFIX: Final = ".served"


def _utcnow() -> datetime:
    return datetime.now(UTC)


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
    _clock: Callable[[], datetime] = field(default=_utcnow, repr=False, compare=False)

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
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._path = path
        self._served_path = path + SERVED_SUFFIX
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
        self._max_schema_version = max_schema_version
        self._clock = clock
        self._lock = threading.Lock()
        # The mark as this process knows it (max of what it noted and read),
        # and what the .served file is known to hold (None: not read yet).
        self._mark = 0
        self._persisted_mark: int | None = None

    @property
    def path(self) -> str:
        return self._path

    @property
    def served_path(self) -> str:
        return self._served_path

    @property
    def trusted_key_ids(self) -> tuple[str, ...]:
        return tuple(self._trusted)

    # ----------------------------------------------------------------- the mark

    def _read_mark_file(self) -> int:
        """The .served file's value; 0 when missing; CacheError(corrupt) when unusable."""
        try:
            with open(self._served_path, "rb") as f:
                raw = f.read(64)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise CacheError(
                reasons.CORRUPT,
                self._served_path,
                f"the served-revision mark cannot be read: {exc.strerror or exc}",
            ) from exc
        text = raw.strip()
        if not text.isdigit() or len(text) > 20:
            raise CacheError(
                reasons.CORRUPT,
                self._served_path,
                "the served-revision mark is not a revision id; delete it to reset "
                "rollback protection",
            )
        return int(text)

    def _known_mark(self) -> int:
        """The mark for a write path: a garbled or unreadable file counts as 0 and is rewritten."""
        if self._persisted_mark is None:
            try:
                self._persisted_mark = self._read_mark_file()
            except CacheError:
                self._persisted_mark = -1  # never equal to a target: forces a rewrite
            self._mark = max(self._mark, self._persisted_mark)
        return self._mark

    def _write_mark(self, value: int) -> None:
        if self._persisted_mark == value:
            return  # no fsync per publish when nothing changed
        try:
            write_atomic(self._served_path, f"{value}\n".encode("ascii"), mode=0o600)
        except OSError as exc:
            raise CacheUnwritable(
                self._served_path,
                f"the served-revision mark could not be written: {exc.strerror or exc}",
            ) from exc
        self._persisted_mark = value

    def note_served(self, revision: int) -> None:
        """Record that this replica served ``revision``: raise the mark to it if below.

        Raises :class:`CacheUnwritable` when the mark file cannot be written;
        the mark is raised in memory regardless, and the write is retried by
        the next call.
        """
        if revision < 0:
            raise ValueError(f"revision must be >= 0, got {revision}")
        with self._lock:
            target = max(self._known_mark(), revision)
            self._mark = target
            self._write_mark(target)

    # ----------------------------------------------------------------- export

    def export(self, *, revision: int, generation: int, schema_version: int, body: bytes) -> None:
        """Sign and durably write ``body`` as the cache; set the served mark to ``revision``.

        Raises :class:`CacheUnwritable` (``OSError`` chained) when either file
        cannot be written, or when no signing key is configured. Blocking.
        """
        for name, value in (
            ("revision", revision),
            ("generation", generation),
            ("schema_version", schema_version),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self._signing_key is None or self.signing_key_id is None:
            raise CacheUnwritable(self._path, "no signing key is configured ($.cache.signing_key)")
        header = encode_header(
            revision=revision,
            generation=generation,
            schema_version=schema_version,
            created_at=self._clock(),
            body=body,
            key_id=self.signing_key_id,
        )
        data = encode_file(header, body, self._signing_key)
        with self._lock:
            # Order the two writes so that a crash between them never leaves
            # the mark above the cache's revision (that would refuse a good
            # cache as a rollback).
            if revision < self._known_mark():
                self._write_mark(revision)
                self._mark = revision
                self._write_cache(data)
            else:
                self._write_cache(data)
                self._mark = revision
                self._write_mark(revision)

    def _write_cache(self, data: bytes) -> None:
        try:
            write_atomic(self._path, data, mode=0o600)
        except OSError as exc:
            raise CacheUnwritable(
                self._path, f"the cache could not be written: {exc.strerror or exc}"
            ) from exc

    # ----------------------------------------------------------------- load

    def load(self) -> CachedRevision | None:
        """The verified cached revision; None when there is no cache file.

        Raises :class:`CacheSkew` for a newer format (treat as no cache) and
        :class:`CacheError` for every other refusal. Blocking.
        """
        try:
            with open(self._path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CacheError(
                reasons.CORRUPT, self._path, f"cannot be read: {exc.strerror or exc}"
            ) from exc
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
            # Strict here, unlike the write paths: a garbled mark refuses the
            # cache instead of quietly disabling rollback protection.
            mark = max(self._mark, self._read_mark_file())
        if header.revision < mark:
            raise CacheError(
                ROLLBACK,
                self._path,
                f"revision {header.revision} is older than revision {mark}, which this "
                f"replica already served",
                revision=header.revision,
            )
        return CachedRevision(
            revision=header.revision,
            generation=header.generation,
            schema_version=header.schema_version,
            created_at=header.created_at,
            body=body,
            key_id=header.key_id,
            _clock=self._clock,
        )
