"""The signed statement: what a root says about its desired revision, and for how long.

A statement is the signed header of a cache file in ``format_version`` 2
(:mod:`supervisor.sinks.lkg.fileformat`): the revision id and its body's
SHA-256, the root's ``sequence`` (``supervisor_desired.sequence``: it grows at
every change of desired state, an operator's rollback included), the root's
control-plane ``root`` identity, ``issued_at`` and ``expires_at`` (UTC).

Only a root signs one (after a successful read of its control plane, so a
root that cannot read it lets its statement age); a follower passes the
root's bytes on unchanged (:attr:`Statement.signed`), so every hop verifies
the root's signature. Its freshness is the follower's proof that the root was
alive and reading its control plane at ``issued_at``.

:meth:`Statement.etag` is what ``GET /v1/revision`` answers as ``ETag``: it
changes whenever the sequence, the body or ``issued_at`` does, so a revision
id reused for another body (a restore from a backup) is never a 304.

Its times are checked where they enter (:func:`utc_times`): each converts to
UTC inside years :data:`YEARS`, and the window from ``issued_at`` to
``expires_at`` is at most :data:`MAX_WINDOW_S`; a signed header outside these
is refused as ``corrupt`` before any clock arithmetic sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final

from supervisor.bounds import OutOfRange, check_range
from supervisor.status_doc import StatementReport

__all__ = ["MAX_WINDOW_S", "YEARS", "Statement", "etag_of", "utc_times"]

#: The years a statement's times may fall in, after conversion to UTC.
YEARS: Final = (2000, 9998)
#: The longest a statement may be valid: ``expires_at - issued_at``, in seconds.
MAX_WINDOW_S: Final = 30 * 86400

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


def _utc(what: str, moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise OutOfRange(what, moment.isoformat(), "a time with its offset", "")
    try:
        utc = moment.astimezone(UTC)
    except (OverflowError, ValueError):  # past year 9999 or before year 1 once converted
        raise OutOfRange(what, moment.isoformat(), *YEARS) from None
    check_range(f"{what} (year, in UTC)", utc.year, *YEARS)
    return utc


def utc_times(issued_at: datetime, expires_at: datetime) -> tuple[datetime, datetime]:
    """Both times in UTC, in range (module docstring); :class:`OutOfRange` otherwise.

    A time without an offset is out of range too.
    """
    issued, expires = _utc("issued_at", issued_at), _utc("expires_at", expires_at)
    check_range("expires_at - issued_at (seconds, at most 30 days)",
                (expires - issued).total_seconds(), 0.0, float(MAX_WINDOW_S))
    return issued, expires


def etag_of(sequence: int, body_sha256_hex: str, issued_at: datetime) -> str:
    """The quoted ETag of a statement: sequence, digest prefix and issued_at in microseconds."""
    micros = (issued_at - _EPOCH) // _MICROSECOND
    return f'"{sequence}.{body_sha256_hex[:32]}.{micros}"'


@dataclass(frozen=True)
class Statement:
    """One signed statement (module docstring); ``signed``: the root's file bytes, if kept."""

    revision: int
    body_sha256: str  # lowercase hex
    sequence: int
    root: str
    issued_at: datetime
    expires_at: datetime
    signed: bytes | None = field(default=None, repr=False, compare=False)

    def etag(self) -> str:
        return etag_of(self.sequence, self.body_sha256, self.issued_at)

    def expired(self, now: datetime) -> bool:
        return now >= self.expires_at

    def age_s(self, now: datetime) -> float:
        """Seconds since the root issued it (0 when this clock is behind the root's)."""
        return max(0.0, (now - self.issued_at).total_seconds())

    def without_bytes(self) -> Statement:
        return replace(self, signed=None)

    def report(self, now: datetime) -> StatementReport:
        """The ``revision.statement`` part of /status."""
        return StatementReport(sequence=self.sequence, root=self.root,
                               issued_at=_iso(self.issued_at), expires_at=_iso(self.expires_at),
                               age_s=round(self.age_s(now), 3), stale=self.expired(now))


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
