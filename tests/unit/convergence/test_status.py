"""What the loop tells of its revision: /status's ``revision`` part, the gauges, STATUS=, events.

The report before any attempt, reachability told by an answer alone, the lag
when the desired body's digest is unknown, replaced or forgotten, the lag's
rounding, and a follower's lag and source (the upstream's), against
:class:`RevisionStatus` on a hand-driven clock; then through the loop: the
STATUS= text when nothing serves, the gauges read from the status at every
scrape, and a follower's status event agreeing with its status document.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.admin.context import AdminContext
from supervisor.bounds import DETAIL_BYTES, cut
from supervisor.convergence.outcome import OutcomeKind
from supervisor.convergence.status import RevisionStatus
from supervisor.events import EventBus
from supervisor.sinks.lkg.statement import Statement
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics
from tests.convergence import doc, events_of, make, sample, watched
from tests.fakes.snapshot import FakeSnapshot, restate, serve
from tests.fakes.store import FakeStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_report_before_any_attempt() -> None:
    assert msgspec.to_builtins(RevisionStatus(ActiveState(), clock=Clock()).report()) == {
        "desired": None, "loaded": None, "active": None, "generation": 0, "source": None,
        "lag_s": 0.0, "last_convergence_s": None, "consecutive_failures": 0,
        "last_rejection": None, "control_plane_up": None, "last_error": None,
        "sequence": None, "statement": None, "statement_age_s": None,
    }


def test_an_answer_alone_says_the_control_plane_is_up() -> None:
    status = RevisionStatus(ActiveState(), clock=Clock())
    status.answered()
    assert status.report().control_plane_up is True
    status.unreachable()
    assert status.report().control_plane_up is False
    status.answered()
    assert status.report().control_plane_up is True


def test_a_read_alone_says_the_control_plane_is_up() -> None:
    status = RevisionStatus(ActiveState(), clock=Clock())
    status.observed(3)
    assert status.report().control_plane_up is True


def serving(body: bytes | None, clock: Clock, revision: int = 1) -> RevisionStatus:
    """``revision`` just swapped in from the control plane, with the given body digest."""
    state = ActiveState()
    serve(state, FakeSnapshot(revision, 1), source="control_plane",
               body_sha256=body)
    status = RevisionStatus(state, clock=clock)
    status.published(0.5)
    return status


def test_an_unknown_desired_digest_is_converged_and_another_digest_is_not() -> None:
    clock = Clock()
    status = serving(b"served", clock)
    status.observed(1)  # the digest is not known (a read that did not learn it)
    clock.now += 5.0
    assert status.report().lag_s == 0.0
    status.observed(1, b"restored")  # the same id names another body now
    clock.now += 5.0
    assert status.report().lag_s == 5.0


def test_a_read_without_a_digest_keeps_the_known_digest_of_the_same_id() -> None:
    clock = Clock()
    status = serving(b"served", clock)
    status.observed(1, b"other")
    status.observed(1)
    assert status.desired_sha256 == b"other"
    clock.now += 3.0
    assert status.report().lag_s == 3.0


def test_a_new_digest_of_the_same_id_replaces_the_known_one() -> None:
    clock = Clock()
    status = serving(b"served", clock)
    status.observed(1, b"other")
    clock.now += 2.0
    status.observed(1, b"served")  # repaired in place: converged again
    assert status.desired_sha256 == b"served"
    clock.now += 2.0
    assert status.report().lag_s == 0.0


def test_another_id_without_a_digest_forgets_the_known_digest() -> None:
    clock = Clock()
    status = serving(b"two", clock, revision=2)
    status.observed(1, b"one")
    clock.now += 2.0
    status.observed(2)  # desired moved back to what serves; its digest not learned
    assert status.desired_sha256 is None
    clock.now += 2.0
    assert status.report().lag_s == 0.0


def test_the_lag_is_reported_to_the_microsecond() -> None:
    clock = Clock()
    status = serving(b"served", clock)
    status.observed(2, b"two")
    clock.now += 1.0 / 3.0
    assert status.report().lag_s == 0.333333


def converged(clock: Clock) -> RevisionStatus:
    status = serving(b"served", clock)
    status.observed(1, b"served")
    assert status.report().lag_s == 0.0
    return status


def test_the_lag_grows_from_the_moment_the_control_plane_stops_answering() -> None:
    clock = Clock()
    status = converged(clock)
    status.unreachable()
    clock.now += 10.0
    assert status.report().lag_s == 10.0


def test_an_answer_after_an_outage_ends_the_lag_at_once() -> None:
    clock = Clock()
    status = converged(clock)
    status.unreachable()
    clock.now += 10.0
    status.answered()
    assert status.report().lag_s == 0.0


def test_lag_is_the_divergence_time_and_the_statement_age_is_apart() -> None:
    issued = datetime(2026, 1, 1, tzinfo=UTC)
    statement = Statement(1, "ab" * 32, 4, "sqlite:1:1", issued, issued + timedelta(seconds=300))
    for upstream in (None, "http://hub:9464"):
        state = ActiveState(upstream=upstream)
        serve(state, FakeSnapshot(1, 1), source="control_plane",
                   statement=statement)
        status = RevisionStatus(state, clock=Clock(),
                                wall_clock=lambda: issued + timedelta(seconds=40))
        status.observed(1)
        report = status.report()
        assert report.lag_s == 0.0  # converged: what the root desires serves
        assert report.statement_age_s == 40.0
        assert report.source == (upstream or "control_plane")
        assert report.upstream == (msgspec.UNSET if upstream is None else upstream)


def test_the_statement_expiry_gauge_reads_the_statement_serving_and_zero_without_one() -> None:
    state = ActiveState()
    status = RevisionStatus(state, clock=Clock())
    serve(state, FakeSnapshot(1, 1), source="control_plane")
    assert status.statement_expires_at == 0.0
    issued = datetime(2026, 1, 1, tzinfo=UTC)
    expires = issued + timedelta(seconds=300)
    restate(state, Statement(1, "ab" * 32, 4, "sqlite:1:1", issued, expires))
    assert status.statement_expires_at == expires.timestamp()


def test_a_follower_s_report_names_its_upstream_as_source_where_it_is_made() -> None:
    # /status, the stream's status events and the STATUS= line all read this report
    # (or the state's origin): none patches it afterwards.
    state = ActiveState(upstream="http://hub:9464")
    status = RevisionStatus(state, clock=Clock())
    report = status.report()
    assert (report.source, report.upstream) == (None, "http://hub:9464")  # nothing serving
    serve(state, FakeSnapshot(3, 1), source="control_plane")
    assert state.origin == "http://hub:9464" and state.source == "control_plane"
    report = status.report()
    assert (report.source, report.upstream) == ("http://hub:9464", "http://hub:9464")
    serve(state, FakeSnapshot(3, 2), source="last_known_good")
    assert status.report().source == "last_known_good" == state.origin
    # A replica reading a database: its source as it is, and no upstream key at all.
    plain = ActiveState()
    serve(plain, FakeSnapshot(3, 1), source="control_plane")
    assert "upstream" not in msgspec.to_builtins(RevisionStatus(plain, clock=Clock()).report())
    assert plain.origin == "control_plane"


async def test_not_serving_status_text_names_the_failure() -> None:
    rec, seen = watched(FakeStore(outage=True))
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
    [line] = [e for e in logs if e["event"] == "control plane unreachable"]
    assert line["retry_in_s"] == round(rec.retry_in_s or 0, 3) != rec.retry_in_s
    assert outcome.kind is OutcomeKind.REJECTED and outcome.reason == reasons.UNAVAILABLE
    assert seen.status == ["not serving; last attempt failed: unavailable"]
    assert rec.status.report().control_plane_up is False
    assert sample(rec.report.metrics, "supervisor_control_plane_up") == 0
    # An outage is not a rejection: no event, no last_rejection.
    assert rec.status.report().last_rejection is None
    assert sample(rec.report.metrics, "supervisor_revision_rejections_total", reason="unavailable") == 1


async def test_revision_gauges_read_the_status_between_attempts(
        autojump_clock: trio.testing.MockClock) -> None:
    """One writer per fact: the gauges follow the status report at every scrape.

    The lag grows while the control plane stays unreachable, also between two
    attempts (a gauge set only at each attempt would stand still), and a
    refusal that proves the control plane answered marks it up in both.
    """
    store = FakeStore()
    store.put(doc("chat"))
    rec = make(store)
    await rec.converge_once()
    assert sample(rec.report.metrics, "supervisor_active_revision") == 1
    assert sample(rec.report.metrics, "supervisor_control_plane_up") == 1
    store.put(doc("chat", "mail"))
    store.outage = True
    await rec.converge_once()
    assert sample(rec.report.metrics, "supervisor_control_plane_up") == 0
    assert rec.status.report().control_plane_up is False
    await trio.sleep(100)
    assert sample(rec.report.metrics, "supervisor_convergence_lag_seconds") >= 100
    assert sample(rec.report.metrics, "supervisor_convergence_lag_seconds") == pytest.approx(
        rec.status.lag_s)
    store.outage = False
    store.corrupt.add(2)
    await rec.converge_once()  # refused as corrupt: the control plane answered
    assert rec.status.report().control_plane_up is True
    assert sample(rec.report.metrics, "supervisor_control_plane_up") == 1
    assert sample(rec.report.metrics, "supervisor_desired_revision") == 2
    assert sample(rec.report.metrics, "supervisor_active_revision") == 1


async def test_a_followers_status_event_names_the_upstream_as_its_status_document_does() -> None:
    store = FakeStore()
    store.put(doc("a"))
    status = RevisionStatus(ActiveState(upstream="http://hub:9464"))  # follower wiring
    rec, seen = watched(store, status=status)
    await rec.converge_once()
    store.outage = True
    await rec.converge_once()
    ctx = AdminContext(state=status.state, revision=status, events=EventBus(),
                       metrics=Metrics(process=False), children=dict)
    served = msgspec.to_builtins(ctx.status())["revision"]
    event = [e for e in events_of(seen) if e["type"] == "status"][-1]["revision"]
    serving = ("active", "generation", "source", "upstream", "sequence", "statement")
    assert (event["source"], event["upstream"]) == ("http://hub:9464", "http://hub:9464")
    assert {k: event[k] for k in serving} == {k: served[k] for k in serving}


def test_a_refusal_s_detail_is_cut_in_the_report() -> None:
    status = RevisionStatus(ActiveState(), clock=Clock())
    long = "x" * (4 * DETAIL_BYTES)
    status.failed(2, reasons.PROJECTION, long)
    report = status.report()
    assert report.last_rejection is not None
    assert report.last_rejection.detail == cut(long)
    assert len(report.last_error.encode()) <= DETAIL_BYTES


def test_the_statement_age_is_reported_to_the_millisecond() -> None:
    issued = datetime(2026, 1, 1, tzinfo=UTC)
    statement = Statement(1, "ab" * 32, 4, "sqlite:1:1", issued, issued + timedelta(seconds=300))
    state = ActiveState()
    serve(state, FakeSnapshot(1, 1), source="control_plane", statement=statement)
    status = RevisionStatus(state, clock=Clock(),
                            wall_clock=lambda: issued + timedelta(seconds=40, microseconds=123456))
    assert status.report().statement_age_s == 40.123
