"""The convergence loop against a fake store (our own seam), in virtual time."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory, SchemaTooNew
from supervisor.controlplane.store import RevisionPointer
from supervisor.convergence.outcome import OutcomeKind
from supervisor.errors import BootRefused, ConfigError
from supervisor.sinks.file import SnapshotFile
from tests.convergence import doc, make, sample
from tests.fakes.store import FakeStore


async def test_converge_once_publishes_then_reports_converged() -> None:
    store = FakeStore()
    store.put(doc("chat", keys={"team-a": ["chat"]}))
    rec = make(store)
    outcome = await rec.converge_once()
    assert (outcome.kind, outcome.revision, outcome.generation) == (OutcomeKind.PUBLISHED, 1, 1)
    snap = rec.state.snapshot
    assert snap is not None and snap.revision == 1 and snap.generation == 1
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    report = rec.status.report()
    assert report.desired == report.active == report.loaded == 1
    assert report.source == "control_plane" and report.lag_s == 0.0
    assert sample(rec.metrics, "supervisor_active_revision") == 1
    assert sample(rec.metrics, "supervisor_convergence_attempts_total", outcome="converged") == 1


async def test_empty_store() -> None:
    rec = make(FakeStore())
    assert (await rec.converge_once()).kind is OutcomeKind.EMPTY
    assert rec.state.snapshot is None


async def test_missed_notification_polling_publishes_within_one_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        await trio.sleep(12.3)
        published_at = trio.current_time()
        store.put(doc("a", "b"))  # no signal: as if the NOTIFY was lost
        while rec.state.generation < 2:
            await trio.sleep(0.01)
        assert trio.current_time() - published_at <= 5.0 + 0.011
        nursery.cancel_scope.cancel()
    assert rec.state.snapshot is not None and rec.state.snapshot.revision == 2


async def test_change_signal_wakes_the_loop_early(autojump_clock: trio.testing.MockClock) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=3600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        await trio.sleep(10)
        store.put(doc("a", "b"))
        store.calls.clear()
        start = trio.current_time()
        for _ in range(50):  # a burst coalesces into at most one pending wake-up
            rec.signal.notify("notify")
        while rec.state.generation < 2:
            await trio.sleep(0.001)
        assert trio.current_time() - start < 0.01
        # Observe decides, hydrate follows the change it saw.
        assert [what for what, _ in store.calls[:2]] == ["desired", "hydrate"]
        nursery.cancel_scope.cancel()
    # One wake-up goes straight to the waiting loop, one stays pending; the rest coalesce.
    assert rec.signal.coalesced >= 48
    assert rec.status.report().desired == 2


@pytest.mark.parametrize("trigger", ["notify", "hint", "request", "poll"])
async def test_a_wakeup_against_the_unchanged_active_revision_does_not_hydrate(
        trigger: str) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.calls.clear()
    for _ in range(3):
        assert (await rec.converge_once(trigger)).kind is OutcomeKind.CONVERGED
    assert [what for what, _ in store.calls] == ["desired"] * 3


async def test_rejected_candidate_keeps_previous_snapshot_then_recovers() -> None:
    store = FakeStore()
    store.put(doc("chat", keys={"k": ["chat"]}))
    rec = make(store)
    await rec.converge_once()
    good = rec.state.snapshot
    store.put(doc("chat", keys={"k": ["nope"]}))  # projection: unknown alias
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.REJECTED and outcome.reason == reasons.PROJECTION
    assert rec.state.snapshot is good
    report = rec.status.report()
    assert report.active == 1 and report.desired == 2
    assert report.consecutive_failures == 1
    assert report.last_rejection.revision == 2
    assert report.last_rejection.reason == "projection"
    assert report.lag_s >= 0
    line = next(entry for entry in logs if entry["log_level"] == "warning")
    assert line["reason"] == "projection" and line["revision"] == 2
    assert sample(rec.metrics, "supervisor_revision_rejections_total", reason="projection") == 1
    store.put(doc("chat", "x", keys={"k": ["x"]}))
    outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.PUBLISHED and outcome.revision == 3
    assert rec.status.report().consecutive_failures == 0
    assert rec.state.snapshot is not None and rec.state.snapshot.generation == 2


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\xff\xfe not json", reasons.CORRUPT),
        (json.dumps({"schema_version": 1, "aliases": {"a": {"upstream": "ftp://x"}}}).encode(),
         reasons.VALIDATION),
        (doc("a", keys={"k": ["a"], "j": ["a"]}).replace(b"SECRET_J", b"SECRET_K"), reasons.SNAPSHOT),
    ],
)
async def test_each_compile_reason_reaches_status(body: bytes, reason: str) -> None:
    store = FakeStore()
    store.put(body)
    rec = make(store)
    outcome = await rec.converge_once()
    assert outcome.reason == reason
    assert rec.status.report().last_rejection.reason == reason


async def test_outage_backs_off_to_the_cap_keeps_serving_and_recovers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=0.25, backoff_max_s=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        serving = rec.state.snapshot
        await trio.sleep(1)
        store.outage = True
        outage_start = trio.current_time()
        store.calls.clear()
        await trio.sleep(300)
        attempts = [t for what, t in store.calls if what == "desired"]
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        # Grows (never a hot loop) and is capped at backoff_max_s.
        assert gaps[0] < 1.0
        assert max(gaps) <= 30.0 + 1e-9
        assert gaps[-1] >= 15.0  # jitter keeps at least half of the capped delay
        assert len(attempts) < 30
        assert rec.state.snapshot is serving
        # Lag counts from the first failed observation (the next poll after the outage began).
        assert rec.status.report().lag_s >= 300 - 5.0 - (outage_start - 1)
        assert rec.status.report().consecutive_failures == len(attempts)
        assert sample(rec.metrics, "supervisor_control_plane_up") == 0
        assert rec.status.report().control_plane_up is False
        assert rec.status.report().last_error.startswith("unavailable")
        store.outage = False
        store.put(doc("a", "b"))
        recovery = trio.current_time()
        while rec.state.generation < 2:
            await trio.sleep(0.5)
        assert trio.current_time() - recovery <= 30.0
        assert rec.status.report().consecutive_failures == 0
        assert rec.status.report().lag_s == 0.0
        assert sample(rec.metrics, "supervisor_control_plane_up") == 1
        assert rec.status.report().control_plane_up is True
        assert rec.status.report().last_error is None
        nursery.cancel_scope.cancel()


async def test_bootstrap_refusals() -> None:
    with pytest.raises(BootRefused) as info:
        await make(FakeStore()).bootstrap()
    assert info.value.refusal == "empty"

    store = FakeStore()
    store.put(doc("a"))
    store.corrupt.add(1)
    with pytest.raises(BootRefused) as info:
        await make(store).bootstrap()
    assert info.value.refusal == "corrupt"

    store = FakeStore()
    store.put(doc("a", keys={"k": ["missing"]}))
    with pytest.raises(BootRefused) as info:
        await make(store).bootstrap()
    assert info.value.refusal == "projection"

    store = FakeStore(outage=True)
    with pytest.raises(BootRefused) as info:
        await make(store).bootstrap()
    assert info.value.refusal == "unavailable"
    assert "no last-known-good cache" in str(info.value)


async def test_a_control_plane_schema_newer_than_this_build_is_a_configuration_error() -> None:
    class Migrated(FakeStore):
        async def observe(self) -> RevisionPointer | None:
            raise SchemaTooNew(9, 2)

    with pytest.raises(ConfigError) as info:
        await make(Migrated()).bootstrap()
    assert info.value.path == "$.control_plane.url"
    assert isinstance(info.value.__cause__, SchemaTooNew)
    assert info.value.reason == str(info.value.__cause__)


async def test_bootstrap_publishes_and_run_reports_started_after_it() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            assert rec.state.snapshot is not None
            nursery.cancel_scope.cancel()


async def test_snapshot_file_written_and_failure_logged_once_per_streak(tmp_path: Path) -> None:
    target = tmp_path / "snap.json"
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, snapshot_file=SnapshotFile(str(target)))
    await rec.converge_once()
    assert json.loads(target.read_bytes())["revision"] == 1
    rec.sinks.snapshot_file = SnapshotFile(str(tmp_path / "file-not-dir" / "snap.json"))
    (tmp_path / "file-not-dir").write_text("x")
    with structlog.testing.capture_logs() as logs:
        for i in range(3):
            store.put(doc("a", f"b{i}"))
            outcome = await rec.converge_once()
            assert outcome.kind is OutcomeKind.PUBLISHED  # serving goes on
    warnings = [e for e in logs if e["event"].startswith("sink write failed")]
    assert len(warnings) == 1
    # Three publishes, and before each the retry of the write still due (a
    # failed sink, or one whose file is missing, is retried at every attempt):
    # six failed writes.
    assert sample(rec.metrics, "supervisor_sink_write_failures_total", sink="snapshot_file") == 6
    assert rec.state.snapshot is not None and rec.state.snapshot.revision == 4


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
    assert sample(rec.metrics, "supervisor_active_revision") == 1
    assert sample(rec.metrics, "supervisor_control_plane_up") == 1
    store.put(doc("chat", "mail"))
    store.outage = True
    await rec.converge_once()
    assert sample(rec.metrics, "supervisor_control_plane_up") == 0
    assert rec.status.report().control_plane_up is False
    await trio.sleep(100)
    assert sample(rec.metrics, "supervisor_convergence_lag_seconds") >= 100
    assert sample(rec.metrics, "supervisor_convergence_lag_seconds") == pytest.approx(
        rec.status.lag_s)
    store.outage = False
    store.corrupt.add(2)
    await rec.converge_once()  # refused as corrupt: the control plane answered
    assert rec.status.report().control_plane_up is True
    assert sample(rec.metrics, "supervisor_control_plane_up") == 1
    assert sample(rec.metrics, "supervisor_desired_revision") == 2
    assert sample(rec.metrics, "supervisor_active_revision") == 1


@pytest.mark.parametrize("category", [FailureCategory.DENIED, FailureCategory.CONFLICT])
async def test_a_control_plane_that_answers_with_a_refusal_is_up_and_no_outage(
    category: FailureCategory,
) -> None:
    class Refusing(FakeStore):
        async def observe(self) -> RevisionPointer | None:
            raise ControlPlaneError("permission denied for table supervisor_desired",
                                    category=category)

    store = Refusing()
    store.put(doc("a"))
    rec = make(store)
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
    assert outcome.reason == category.value
    report = rec.status.report()
    assert report.control_plane_up is True
    assert report.last_rejection.reason == category.value
    assert sample(rec.metrics, "supervisor_control_plane_up") == 1.0
    events = [entry["event"] for entry in logs]
    assert "control plane unreachable" not in events
    assert "convergence attempt refused by the control plane; previous snapshot keeps " \
        "serving" in events
