"""The followers a replica lists: names parsed where they enter, forgotten, bounded."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.admin.fleet import MAX_FOLLOWERS, Followers, describe_follower
from supervisor.bounds import DETAIL_BYTES, MAX_SEQUENCE, OutOfRange, TooLarge
from supervisor.commands.fleet import _state_of as fleet_state_of
from supervisor.config import Config, ControlPlaneConfig
from supervisor.controlplane.replica_name import (
    HEADERS,
    MAX_ETAG_BYTES,
    MAX_POLL_INTERVAL_S,
    MAX_REASON_BYTES,
    MAX_URL_BYTES,
    ReplicaName,
    parse,
)
from supervisor.convergence.status import RevisionStatus
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics
from tests.fakes.snapshot import FakeSnapshot, serve


def named(url: str = "http://f1:9464", **fields: str) -> list[tuple[bytes, bytes]]:
    values = {"url": url, "sequence": "7", "etag": '"7.ab.1"', "state": "converged",
              "poll_interval_s": "2", **fields}
    return [(HEADERS[k].encode(), v.encode()) for k, v in values.items()]


def test_a_name_is_read_from_its_headers() -> None:
    assert parse(named(reason="stale", state="stale")) == ReplicaName(
        url="http://f1:9464", sequence=7, etag='"7.ab.1"', state="stale", reason="stale",
        poll_interval_s=2.0)
    assert parse([(b"accept", b"*/*")]) is None


@pytest.mark.parametrize(("field", "value", "error"), [
    ("url", "http://" + "a" * 600, TooLarge),
    ("url", "file:///etc/passwd", OutOfRange),
    ("url", "http://f1\x1b[2J", OutOfRange),
    # No honest follower advertises credentials: listed, anyone reading could use them.
    ("url", "http://user:secret@f1:9464", OutOfRange),
    ("url", "https://@f1", OutOfRange),
    ("sequence", "-1", OutOfRange),
    ("sequence", str(2**63), OutOfRange),
    ("sequence", "seven", OutOfRange),
    ("state", "happy", OutOfRange),
    ("reason", "a b", OutOfRange),
    ("etag", "x" * 200, TooLarge),
    ("poll_interval_s", "nan", OutOfRange),
    ("poll_interval_s", "0", OutOfRange),
])
def test_a_malformed_name_is_refused_where_it_enters(field: str, value: str,
                                                     error: type[Exception]) -> None:
    with pytest.raises(error):
        parse(named(**{field: value}))
    followers = Followers()
    followers.note(named(**{field: value}))  # ignored, never raised
    assert followers.answer().followers == []


def test_a_follower_is_forgotten_after_three_of_its_poll_intervals() -> None:
    now = [0.0]
    followers = Followers(clock=lambda: now[0])
    followers.note(named())
    now[0] = 5.9
    assert [row.url for row in followers.answer().followers] == ["http://f1:9464"]
    now[0] = 6.1
    assert followers.answer().followers == []


def test_a_claimed_poll_interval_is_capped() -> None:
    now = [0.0]
    followers = Followers(clock=lambda: now[0])
    followers.note(named(poll_interval_s="1e300"))
    now[0] = 3 * 3600 + 1
    assert followers.answer().followers == []


def test_the_table_is_bounded_and_keeps_the_most_recent() -> None:
    followers = Followers()
    for i in range(MAX_FOLLOWERS * 4):
        followers.note(named(f"http://hostile-{i}:1"))
    followers.note(named("http://honest:1"))
    rows = followers.answer().followers
    assert len(rows) == MAX_FOLLOWERS
    assert "http://honest:1" in {row.url for row in rows}
    assert "http://hostile-0:1" not in {row.url for row in rows}


def test_the_gauge_counts_followers_by_state() -> None:
    metrics = Metrics(process=False)
    followers = Followers()
    metrics.track_followers(followers.count)
    followers.note(named("http://a:1"))
    followers.note(named("http://b:1", state="refusing", reason="secret"))
    followers.note(named("http://a:1", state="stale", reason="stale"))  # the same one again
    value = metrics.registry.get_sample_value
    assert value("supervisor_followers", {"state": "stale"}) == 1
    assert value("supervisor_followers", {"state": "refusing"}) == 1
    assert value("supervisor_followers", {"state": "converged"}) == 0


def test_a_replica_names_itself_by_its_advertised_url_else_its_listen_address() -> None:
    import msgspec

    from supervisor.admin.fleet import own_url
    from supervisor.config import AdminConfig

    def named_by(**admin: str) -> str:
        return own_url(msgspec.convert(admin, AdminConfig))

    assert named_by(advertise_url="https://edge-1.example:9464") == "https://edge-1.example:9464"
    assert named_by(listen="127.0.0.1:9500") == "http://127.0.0.1:9500"
    assert named_by(listen="[::1]:9500") == "http://[::1]:9500"
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"advertise_url": "http://édge:1"}, AdminConfig)  # not ASCII


def _follower_status(active: int | None, desired: int | None) -> RevisionStatus:
    status = RevisionStatus(ActiveState(upstream="http://root:9464"), clock=lambda: 0.0)
    if active is not None:
        serve(status.state, FakeSnapshot(active, 1), body_sha256=b"d" * 32)
    status.observed(desired, b"d" * 32 if desired == active else b"e" * 32)
    status.answered()
    return status


@pytest.mark.parametrize(("active", "desired", "state"), [
    (1, 1, "converged"), (1, 2, "converging"), (None, 2, "converging")])
def test_a_follower_says_converged_only_when_it_serves_what_is_desired(
        active: int | None, desired: int, state: str) -> None:
    config = Config(control_plane=ControlPlaneConfig(url="http://root:9464"))
    named = describe_follower(config, _follower_status(active, desired))
    assert (named.state, named.reason) == (state, None)


def test_the_fleet_walk_reads_the_same_states_from_a_status_document() -> None:
    def doc(active: int, desired: int, failures: int = 0) -> dict[str, Any]:
        return {"revision": {"active": active, "desired": desired, "control_plane_up": True,
                             "consecutive_failures": failures,
                             "last_rejection": {"reason": "secret"} if failures else None}}

    assert fleet_state_of(doc(1, 1)["revision"]) == ("converged", None)
    assert fleet_state_of(doc(1, 2)["revision"]) == ("converging", None)
    assert fleet_state_of(doc(1, 2, failures=3)["revision"]) == ("refusing", "secret")


_VALUES = (st.binary(max_size=40)
           | st.sampled_from([b"1", b"0", b"-1", b"nan", b"inf", b"-inf", b"1e400", b"0.001",
                              b"3601", str(MAX_SEQUENCE).encode(), str(MAX_SEQUENCE + 1).encode(),
                              b"0x10", b"1_0", b" 7 ", b"\xd9\xa9", b"converged", b"stale",
                              b"refusing", b"a_b", b"a" * 33, b'"7.ab.1"', b"x" * 129,
                              b"http://f1", b"http://a@b/c", b"https://", b"http://f1\x1b",
                              b"http://" + b"a" * 600]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(HEADERS)), st.booleans(), _VALUES),
                max_size=8))
def test_any_follower_headers_give_a_bounded_name_or_a_refusal_of_ours(
    fields: list[tuple[str, bool, bytes]]
) -> None:
    headers = [(HEADERS[field].upper().encode() if upper else HEADERS[field].encode(), value)
               for field, upper, value in fields]
    try:
        name = parse(headers)
    except (TooLarge, OutOfRange) as exc:
        assert str(exc).isprintable() and len(str(exc).encode()) <= DETAIL_BYTES
        return
    if name is None:
        return
    assert name.url.startswith(("http://", "https://")) and len(name.url) <= MAX_URL_BYTES
    assert "@" not in name.url.split("/")[2]
    assert name.etag is None or len(name.etag) <= MAX_ETAG_BYTES
    assert name.reason is None or len(name.reason) <= MAX_REASON_BYTES
    assert name.sequence is None or 0 <= name.sequence <= MAX_SEQUENCE
    assert 0.01 <= name.poll_interval_s <= MAX_POLL_INTERVAL_S
    for text in (name.url, name.etag or "", name.reason or "", name.state):
        assert text.isascii() and text.isprintable()
