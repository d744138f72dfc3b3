"""Any bytes and any field values at the statement's parsers end in a refusal, never a crash.

The cache header (:func:`~supervisor.sinks.lkg.fileformat.decode_file`) is
given arbitrary bytes, and signed headers whose fields hold arbitrary JSON
values (times with any offset among them); the accepted file is given
arbitrary bytes. Each either refuses with its reason (``CacheError``,
``ConfigError``) or yields a statement every later use can handle: its ETag,
its report, its re-export, the acceptance rule.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.errors import ConfigError
from supervisor.sinks.lkg import CacheError, encode_header, key_id_of
from supervisor.sinks.lkg.accepted import AcceptedStatements, refusal_of
from supervisor.sinks.lkg.fileformat import decode_file
from supervisor.sinks.lkg.statement import MAX_WINDOW_S, YEARS
from tests.fakes.statements import Root

ROOT = Root()
TRUSTED = {key_id_of(ROOT.key.verify_key): ROOT.key.verify_key}
FIELDS = ("format_version", "revision", "generation", "schema_version", "created_at",
          "body_length", "body_sha256", "key_id", "sequence", "root", "issued_at", "expires_at")


def times() -> st.SearchStrategy[str]:
    """RFC 3339 texts with any offset, the extreme years included."""
    moments = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31))
    offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1)
    return st.builds(lambda m, o: m.isoformat() + ("Z" if o == 0 else
                     f"{'+' if o > 0 else '-'}{abs(o) // 60:02d}:{abs(o) % 60:02d}"),
                     moments, offsets)


values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                   st.text(max_size=40), times(), st.lists(st.integers(), max_size=3))


def judged(data: bytes) -> None:
    """decode_file refuses, or everything downstream of it works on what it yields."""
    try:
        header, body = decode_file(data, "<upstream>", TRUSTED)
    except CacheError as exc:
        assert exc.reason in ("corrupt", "denied", "incompatible") and exc.detail
        return
    statement = header.statement(data)
    if statement is None:
        return
    low, high = YEARS
    assert low <= statement.issued_at.year <= high and low <= statement.expires_at.year <= high
    assert statement.issued_at.utcoffset() == timedelta(0)
    window = (statement.expires_at - statement.issued_at).total_seconds()
    assert 0 <= window <= MAX_WINDOW_S
    now = datetime.now(UTC)
    statement.etag()
    statement.report(now)
    statement.expired(now)
    refusal_of(statement, statement)
    encode_header(revision=header.revision, generation=header.generation,
                  schema_version=header.schema_version, created_at=header.created_at,
                  body=body, key_id=header.key_id, statement=statement)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_are_refused_with_a_reason(data: bytes) -> None:
    judged(data)


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), values, max_size=4))
def test_any_signed_field_values_are_judged_without_another_exception(
    fields: dict[str, object]
) -> None:
    judged(ROOT.sign_fields(3, 3, **fields))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(("issued_at", "expires_at")), times())
def test_any_signed_time_is_in_range_or_corrupt(name: str, moment: str) -> None:
    judged(ROOT.sign_fields(3, 3, **{name: moment}))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300),
                 st.dictionaries(st.sampled_from((*FIELDS, "reset", "pinned")), values,
                                 max_size=6).map(lambda d: json.dumps(d).encode())))
def test_any_accepted_file_is_read_or_refused_as_a_configuration_error(
    tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "lkg.bin.accepted"
    path.write_bytes(data)
    try:
        accepted = AcceptedStatements(str(path))
    except ConfigError as exc:
        assert str(path) in str(exc)
        return
    if accepted.highest is not None:
        accepted.highest.etag()
        accepted.highest.report(datetime.now(UTC))
