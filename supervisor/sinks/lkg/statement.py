"""The signed statement: what a root says about its desired revision, and for how long."""

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
    """Both times in UTC, in range; :class:`OutOfRange` otherwise.

    Each must have an offset and fall in years :data:`YEARS` once in UTC. The window
    ``expires_at - issued_at`` is at most :data:`MAX_WINDOW_S`. A signed header outside
    these is ``corrupt`` before any clock arithmetic sees it.
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
    """One signed statement; ``signed``: the root's file bytes, if kept.

    It is a format_version 2 cache header: the revision and its body's SHA-256, the
    root's ``sequence``, its control-plane ``root`` identity, ``issued_at`` and
    ``expires_at`` (UTC). ``sequence`` is ``supervisor_desired.sequence``: it grows at
    every change of desired state, rollbacks included.

    Only a root signs one, after a successful read of its control plane; a root that
    cannot read lets it age. A follower forwards the root's bytes unchanged
    (:attr:`signed`), so every hop verifies the root's signature. Its freshness proves
    the root was alive and reading at ``issued_at``.
    """

    revision: int
    body_sha256: str  # lowercase hex
    sequence: int
    root: str
    issued_at: datetime
    expires_at: datetime
    signed: bytes | None = field(default=None, repr=False, compare=False)

    def etag(self) -> str:
        """What ``GET /v1/revision`` answers as ``ETag``.

        It changes with the sequence, the body or ``issued_at``. So a revision id reused
        for another body (a restore from backup) is never a 304.
        """
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
