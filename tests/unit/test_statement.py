"""The signed statement: its ETag, expiry and age, and the acceptance rule against the highest."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from supervisor.bounds import OutOfRange
from supervisor.sinks.lkg import Statement
from supervisor.sinks.lkg.accepted import refusal_of, supersedes
from supervisor.sinks.lkg.statement import utc_times
from supervisor.status_doc import StatementReport

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
SHA = "ab" * 32
HIGHEST = Statement(3, SHA, 7, "pg:1:2", T0, T0 + timedelta(seconds=300))


def test_the_etag_changes_with_sequence_digest_and_issued_at_only() -> None:
    etag = HIGHEST.etag()
    assert etag == f'"7.{SHA[:32]}.{int(T0.timestamp()) * 1_000_000}"'
    assert replace(HIGHEST, sequence=8).etag() != etag
    assert replace(HIGHEST, body_sha256="cd" * 32).etag() != etag
    assert replace(HIGHEST, issued_at=T0 + timedelta(microseconds=1)).etag() != etag
    assert replace(HIGHEST, revision=4, expires_at=T0, signed=b"x").etag() == etag


def test_expiry_is_at_expires_at_and_age_never_negative() -> None:
    assert not HIGHEST.expired(T0 + timedelta(seconds=299.999))
    assert HIGHEST.expired(T0 + timedelta(seconds=300))
    assert HIGHEST.age_s(T0 - timedelta(seconds=5)) == 0.0
    assert HIGHEST.age_s(T0 + timedelta(seconds=12.5)) == 12.5
    report = HIGHEST.report(T0 + timedelta(seconds=301))
    assert report == StatementReport(sequence=7, root="pg:1:2", issued_at="2026-12-01T10:00:00Z",
                                     expires_at="2026-12-01T10:05:00Z", age_s=301.0, stale=True)


def test_without_bytes_drops_only_the_signed_bytes() -> None:
    signed = replace(HIGHEST, signed=b"x")
    assert signed.without_bytes() == HIGHEST and signed.without_bytes().signed is None


@pytest.mark.parametrize(("changes", "reason"), [
    ({}, None),  # the same statement again
    ({"issued_at": T0 + timedelta(seconds=1)}, None),  # a refresh
    ({"issued_at": T0 - timedelta(seconds=1)}, None),  # a sibling root's, or an earlier one
    ({"sequence": 8, "revision": 1}, None),  # an operator's rollback: higher sequence
    ({"sequence": 6, "issued_at": T0 + timedelta(days=1)}, "rollback"),  # older intent
    ({"revision": 4}, "corrupt"),  # one sequence, two revisions
    ({"body_sha256": "cd" * 32}, "corrupt"),  # one sequence, two bodies
    # Another root identity, however issued: the follower is pinned to its first.
    ({"root": "pg:9:9", "sequence": 1, "issued_at": T0 + timedelta(seconds=1)}, "denied"),
    ({"root": "pg:9:9", "sequence": 99, "issued_at": T0}, "denied"),
    ({"root": "pg:9:9", "sequence": 99, "issued_at": T0 - timedelta(seconds=1)}, "denied"),
])
def test_refusal_against_the_highest_accepted(changes: dict[str, object],
                                              reason: str | None) -> None:
    candidate = replace(HIGHEST, **changes)  # type: ignore[arg-type]
    refused = refusal_of(candidate, HIGHEST)
    assert (refused[0] if refused else None) == reason
    assert refusal_of(candidate, None) is None


def test_the_signed_bytes_are_neither_compared_nor_shown() -> None:
    signed = replace(HIGHEST, signed=b"\x00secret-looking bytes")
    assert signed == HIGHEST
    assert "secret-looking" not in repr(signed)
    report = replace(HIGHEST, issued_at=T0).report(T0 + timedelta(seconds=12.34567))
    assert report.age_s == 12.346


def test_a_corrupt_refusal_names_both_digests_by_their_first_12_hex_characters() -> None:
    refused = refusal_of(replace(HIGHEST, body_sha256="cd" * 32), HIGHEST)
    assert refused is not None and refused[0] == "corrupt"
    assert "(sha256 cdcdcdcdcdcd)" in refused[1] and "(sha256 abababababab)" in refused[1]


def test_another_root_is_denied_naming_both_until_root_identity_names_it() -> None:
    other = replace(HIGHEST, root="pg:9:9", sequence=1)
    refused = refusal_of(other, HIGHEST)
    assert refused is not None and refused[0] == "denied"
    assert "'pg:9:9'" in refused[1] and "'pg:1:2'" in refused[1]
    assert "follower reset" in refused[1]
    assert "(by the first statement it accepted)" in refused[1]
    # [control_plane].root_identity re-pins: the new root's count starts afresh.
    assert refusal_of(other, HIGHEST, "pg:9:9") is None
    refused = refusal_of(HIGHEST, None, "pg:9:9")
    assert refused is not None and "[control_plane].root_identity" in refused[1]


def test_a_rollback_names_both_sequences_and_the_root() -> None:
    refused = refusal_of(replace(HIGHEST, sequence=2), HIGHEST)
    assert refused is not None and refused[0] == "rollback"
    assert all(text in refused[1] for text in ("sequence 2", "sequence 7", "'pg:1:2'",
                                                "follower reset"))


def test_of_two_siblings_the_later_expiring_supersedes() -> None:
    later = replace(HIGHEST, issued_at=T0 - timedelta(seconds=5),
                    expires_at=HIGHEST.expires_at + timedelta(seconds=1))
    assert supersedes(later, HIGHEST) and not supersedes(HIGHEST, later)
    assert not supersedes(HIGHEST, HIGHEST)
    assert supersedes(replace(HIGHEST, sequence=8), HIGHEST)
    assert not supersedes(replace(HIGHEST, sequence=6), HIGHEST)
    assert supersedes(HIGHEST, None) and supersedes(replace(HIGHEST, root="x"), HIGHEST)


def test_times_in_years_2000_to_9998_in_utc_are_in_range_and_others_out_of_range() -> None:
    east = timezone(timedelta(hours=2))
    issued, expires = utc_times(datetime(2000, 1, 1, 2, 0, tzinfo=east),
                                datetime(2000, 1, 1, 3, 0, tzinfo=east))
    assert issued.utcoffset() == timedelta(0) and issued.year == 2000 and expires.hour == 1
    utc_times(datetime(9998, 12, 31, 0, 0, tzinfo=UTC), datetime(9998, 12, 31, 1, 0, tzinfo=UTC))
    out = [(datetime(1999, 12, 31, 23, 0, tzinfo=UTC), datetime(2000, 1, 1, 1, 0, tzinfo=UTC)),
           (datetime(9998, 12, 31, 23, 0, tzinfo=UTC), datetime(9999, 1, 1, 1, 0, tzinfo=UTC)),
           (datetime(2000, 1, 1, 1, 0, tzinfo=east), datetime(2000, 1, 1, 3, 0, tzinfo=UTC))]
    for issued_at, expires_at in out:
        with pytest.raises(OutOfRange) as info:
            utc_times(issued_at, expires_at)
        assert "(year, in UTC)" in info.value.what


def test_a_time_without_offset_or_past_the_calendar_in_utc_is_out_of_range() -> None:
    with pytest.raises(OutOfRange) as info:
        utc_times(datetime(2026, 1, 1), T0)
    assert info.value.what == "issued_at" and info.value.low == "a time with its offset"
    west = timezone(-timedelta(hours=2))
    with pytest.raises(OutOfRange) as info:
        utc_times(T0, datetime(9999, 12, 31, 23, 0, tzinfo=west))
    assert (info.value.what, info.value.low, info.value.high) == ("expires_at", 2000, 9998)
    with pytest.raises(OutOfRange) as info:
        utc_times(datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))), T0)
    assert (info.value.what, info.value.low, info.value.high) == ("issued_at", 2000, 9998)


def test_the_window_is_0_to_30_days_inclusive() -> None:
    assert utc_times(T0, T0) == (T0, T0)
    assert utc_times(T0, T0 + timedelta(days=30)) == (T0, T0 + timedelta(days=30))
    for expires_at in (T0 - timedelta(microseconds=1), T0 + timedelta(days=30, seconds=1)):
        with pytest.raises(OutOfRange) as info:
            utc_times(T0, expires_at)
        assert info.value.what.startswith("expires_at - issued_at")
