"""The convergence loop's resilience paths: booting from the cache, and what each attempt reports.

Every restore branch of ``bootstrap`` (skew, a refused cache, an uncompilable
cache, no cache file, the republish as ``control_plane`` once the control plane
answers again), and the visible effects of each attempt: the status report,
the events on the bus, the metrics and the ``STATUS=`` text. Against the fake
store of ``tests/fakes/store.py`` and the real signed cache on a temporary directory
(or a fake one raising the cache's own errors); virtual time throughout.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.convergence.outcome import OutcomeKind
from supervisor.errors import BootRefused
from supervisor.revision.errors import RevisionError
from supervisor.sinks.lkg import CacheError, CacheSkew
from supervisor.sinks.state import ActiveState
from tests.convergence import doc, events_of, exported, make, real_cache, sample, watched
from tests.fakes.store import FakeStore

LKG = "supervisor_last_known_good_events_total"


# -- restore: the successful path and the republish --------------------------------------


async def test_boot_from_the_cache_then_republish_the_same_revision_from_the_control_plane(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    body = doc("a", keys={"k": ["a"]})
    store = FakeStore(outage=True)
    store.revisions[3] = body
    store.desired_id = 3
    cache = exported(tmp_path, body, revision=3)
    rec, seen = watched(store, cache=real_cache(tmp_path))
    mock_clock.jump(100)
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.bootstrap()
    assert (outcome.kind, outcome.revision, outcome.generation) == (OutcomeKind.PUBLISHED, 3, 1)
    snapshot = rec.state.snapshot
    assert snapshot is not None and snapshot.revision == 3
    assert rec.state.body_sha256 == hashlib.sha256(body).digest()
    report = rec.status.report()
    assert (report.active, report.loaded, report.source) == (3, 3, "last_known_good")
    assert report.control_plane_up is False
    assert sample(rec.metrics, LKG, event="restored") == 1
    assert sample(rec.metrics, LKG, event="refused") == 0
    assert sample(rec.metrics, "supervisor_active_revision") == 3
    assert sample(rec.metrics, "supervisor_active_generation") == 1
    assert seen.status == ["serving revision 3 (generation 1, last_known_good)"]
    published = [e for e in events_of(seen) if e["type"] == "published"]
    assert [(e["revision"], e["generation"], e["source"]) for e in published] == [
        (3, 1, "last_known_good")]
    [line] = [e for e in logs if e["event"] == "serving the last-known-good cache"]
    assert line["revision"] == 3 and line["cause"] == "unavailable"
    assert rec.status.stalled_for() == 0

    # The control plane answers again with the very same revision: it is
    # published again, now from the control plane (a new generation), and the
    # cache is written again by this run.
    store.outage = False
    outcome = await rec.converge_once()
    assert (outcome.kind, outcome.revision, outcome.generation) == (OutcomeKind.PUBLISHED, 3, 2)
    assert rec.status.report().source == "control_plane"
    assert rec.status.report().lag_s == 0.0
    assert seen.status[-1] == "serving revision 3 (generation 2, control_plane)"
    assert sample(rec.metrics, LKG, event="exported") == 1
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert cache.load() is not None


async def test_an_incompatible_desired_revision_boots_from_the_cache(tmp_path: Path) -> None:
    body = doc("a")
    store = FakeStore()
    store.put(body)
    store.put(json.dumps({"schema_version": 9}).encode())  # a newer schema: incompatible
    exported(tmp_path, body, revision=1)
    rec, seen = watched(store, cache=real_cache(tmp_path))
    outcome = await rec.bootstrap()
    assert outcome.kind is OutcomeKind.PUBLISHED and outcome.revision == 1
    assert rec.status.report().source == "last_known_good"
    assert rec.status.report().last_rejection.reason == reasons.INCOMPATIBLE
    rejected = [e for e in events_of(seen) if e["type"] == "rejected"]
    assert [(e["revision"], e["reason"]) for e in rejected] == [(2, reasons.INCOMPATIBLE)]


async def test_an_unavailable_secret_at_boot_restores_from_the_cache(tmp_path: Path) -> None:
    class FlakyResolver:
        def resolve(self, reference: str) -> bytes:
            raise RevisionError(reasons.UNAVAILABLE, "EMFILE: too many open files")

    body = doc("a", keys={"k": ["a"]})
    store = FakeStore()
    store.put(body)
    exported(tmp_path, body)
    rec = make(store, cache=real_cache(tmp_path), resolver=FlakyResolver())
    # The cache compiles with the same resolver: the secret stage refuses it.
    with pytest.raises(BootRefused) as info:
        await rec.bootstrap()
    assert info.value.refusal == "cache"
    assert "does not compile" in str(info.value)


async def test_an_unavailable_secret_at_boot_serves_a_cache_without_keys(tmp_path: Path) -> None:
    class FlakyResolver:
        def resolve(self, reference: str) -> bytes:
            raise RevisionError(reasons.UNAVAILABLE, "EMFILE: too many open files")

    store = FakeStore()
    store.put(doc("a", keys={"k": ["a"]}))
    exported(tmp_path, doc("a"))
    rec = make(store, cache=real_cache(tmp_path), resolver=FlakyResolver())
    outcome = await rec.bootstrap()
    assert outcome.kind is OutcomeKind.PUBLISHED
    assert rec.status.report().source == "last_known_good"


# -- restore: every refusal ---------------------------------------------------------------


async def test_boot_without_a_cache_file_is_refused_with_the_cause(tmp_path: Path) -> None:
    rec, seen = watched(FakeStore(outage=True), cache=real_cache(tmp_path))
    with pytest.raises(BootRefused) as info:
        await rec.bootstrap()
    assert info.value.refusal == reasons.UNAVAILABLE
    assert "cache file does not exist yet" in str(info.value)
    assert rec.state.snapshot is None
    assert seen.status == []
    assert sample(rec.metrics, LKG, event="refused") == 0


async def test_boot_with_an_uncompilable_cache_is_refused_as_cache(tmp_path: Path) -> None:
    exported(tmp_path, doc("a", keys={"k": ["missing"]}), revision=4)  # projection
    rec, seen = watched(FakeStore(outage=True), cache=real_cache(tmp_path))
    with pytest.raises(BootRefused) as info:
        await rec.bootstrap()
    assert info.value.refusal == "cache"
    assert "(revision 4) does not compile (projection)" in str(info.value)
    assert rec.state.snapshot is None
    assert rec.status.report().active is None
    assert seen.status == []
    assert sample(rec.metrics, LKG, event="refused") == 1
    assert sample(rec.metrics, LKG, event="restored") == 0


@dataclass
class RefusingCache:
    """The cache's load surface, refusing as the real one does."""

    error: CacheError
    path: str = "/fake/lkg"

    def load(self) -> Any:
        raise self.error


async def test_boot_with_a_cache_from_a_newer_format_is_refused_as_skew() -> None:
    skew = CacheSkew("/fake/lkg", "format_version 9 is newer than this build reads",
                     format_version=9)
    rec, seen = watched(FakeStore(outage=True), cache=RefusingCache(skew))
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(BootRefused) as info:
            await rec.bootstrap()
    assert info.value.refusal == "cache"
    assert "version skew" in str(info.value)
    assert sample(rec.metrics, LKG, event="refused") == 1
    assert any("version skew" in e["event"] for e in logs)
    assert rec.state.snapshot is None
    assert seen.status == []


async def test_boot_with_a_refused_cache_names_the_cache_refusal(tmp_path: Path) -> None:
    cache = real_cache(tmp_path)
    cache.export(revision=5, generation=1, schema_version=1, body=doc("a"))
    cache.note_served(9)  # served 9 since: the cache of 5 is a rollback
    rec, _ = watched(FakeStore(outage=True), cache=real_cache(tmp_path))
    with pytest.raises(BootRefused) as info:
        await rec.bootstrap()
    assert info.value.refusal == "cache"
    assert "refused (rollback)" in str(info.value)
    assert sample(rec.metrics, LKG, event="refused") == 1


async def test_a_corrupt_desired_revision_is_refused_without_trying_the_cache(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    store.corrupt.add(1)
    exported(tmp_path, doc("a"))
    rec = make(store, cache=real_cache(tmp_path))
    with pytest.raises(BootRefused) as info:
        await rec.bootstrap()
    assert info.value.refusal == reasons.CORRUPT
    assert "control plane refused" in str(info.value)
    assert rec.state.snapshot is None


async def test_an_invalid_desired_revision_is_refused_without_trying_the_cache(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    store.put(doc("a", keys={"k": ["missing"]}))
    exported(tmp_path, doc("a"))
    rec = make(store, cache=real_cache(tmp_path))
    with pytest.raises(BootRefused) as info:
        await rec.bootstrap()
    assert info.value.refusal == reasons.PROJECTION
    assert "desired revision 1 cannot be served (projection)" in str(info.value)
    assert rec.state.snapshot is None


async def test_a_successful_boot_is_counted_and_clears_failures(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    mock_clock.jump(100)
    outcome = await rec.bootstrap()
    assert outcome.kind is OutcomeKind.PUBLISHED
    assert sample(rec.metrics, "supervisor_convergence_attempts_total", outcome="published") == 1
    report = rec.status.report()
    assert report.consecutive_failures == 0 and report.source == "control_plane"
    assert seen.status == ["serving revision 1 (generation 1, control_plane)"]
    assert rec.status.stalled_for() == 0


async def test_run_boots_from_the_cache_before_reporting_started(tmp_path: Path) -> None:
    # Real time: the cache is read in a worker thread, which an autojumping
    # clock would take for idleness and jump past the guard.
    exported(tmp_path, doc("a"))
    rec = make(FakeStore(outage=True), cache=real_cache(tmp_path))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            assert rec.status.report().source == "last_known_good"
            nursery.cancel_scope.cancel()


async def test_run_on_a_restarted_child_does_not_bootstrap_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    first = make(store)
    await first.bootstrap()
    store.outage = True  # a second bootstrap would refuse to boot
    second = make(store, status=first.status)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(second.run)
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
    assert first.state.generation == 1


# -- visible effects of ordinary attempts ---------------------------------------------


async def test_publish_refusal_and_recovery_are_visible_everywhere() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    store.put(doc("a", keys={"k": ["nope"]}))
    outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.REJECTED and rec.retry_in_s == 5.0
    assert seen.status[-1] == "serving revision 1; last attempt failed: projection"
    rejected = [e for e in events_of(seen) if e["type"] == "rejected"]
    assert [(e["revision"], e["reason"], e["active"]) for e in rejected] == [
        (2, "projection", 1)]
    assert sample(rec.metrics, "supervisor_desired_revision") == 2
    assert sample(rec.metrics, "supervisor_convergence_attempts_total", outcome="rejected") == 1
    assert rec.status.report().last_error.startswith("projection")
    # The same refusal again: not hydrated, still reported, not a new event.
    again = await rec.converge_once()
    assert again.kind is OutcomeKind.REJECTED and again.repeated
    assert rec.status.report().consecutive_failures == 2
    assert len([e for e in events_of(seen) if e["type"] == "rejected"]) == 1
    store.put(doc("a", "b"))
    outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.PUBLISHED
    assert seen.status[-1] == "serving revision 3 (generation 2, control_plane)"
    assert rec.status.report().consecutive_failures == 0
    assert rec.status.report().last_error is None


async def test_not_serving_status_text_names_the_failure() -> None:
    rec, seen = watched(FakeStore(outage=True))
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
    [line] = [e for e in logs if e["event"] == "control plane unreachable"]
    assert line["retry_in_s"] == round(rec.retry_in_s or 0, 3) != rec.retry_in_s
    assert outcome.kind is OutcomeKind.REJECTED and outcome.reason == reasons.UNAVAILABLE
    assert seen.status == ["not serving; last attempt failed: unavailable"]
    assert rec.status.report().control_plane_up is False
    assert sample(rec.metrics, "supervisor_control_plane_up") == 0
    # An outage is not a rejection: no event, no last_rejection.
    assert rec.status.report().last_rejection is None
    assert sample(rec.metrics, "supervisor_revision_rejections_total", reason="unavailable") == 1


async def test_reachability_changes_are_published_once_each() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    await rec.converge_once()
    store.outage = True
    await rec.converge_once()
    await rec.converge_once()
    store.outage = False
    await rec.converge_once()
    ups = [e["control_plane_up"] for e in events_of(seen) if e["type"] == "status"]
    assert ups == [True, False, True]
    assert sample(rec.metrics, "supervisor_control_plane_up") == 1


async def test_retry_delays_back_off_on_outage_and_reset_after_success() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=1.0, backoff_max_s=30.0)

    async def delay_after_an_attempt() -> float | None:
        await rec.converge_once()
        return rec.retry_in_s

    assert await delay_after_an_attempt() == 5.0
    store.outage = True
    delays = [await delay_after_an_attempt() for _ in range(4)]
    assert all(d is not None for d in delays)
    nominal = [1.0, 2.0, 4.0, 8.0]
    assert all(n * 0.5 <= d <= n for d, n in zip(delays, nominal, strict=True))  # type: ignore[operator]
    store.outage = False
    assert await delay_after_an_attempt() == 5.0
    store.outage = True
    first_again = await delay_after_an_attempt()
    assert first_again is not None and first_again <= 1.0


async def test_a_store_refusal_of_the_desired_revision_is_a_rejection_not_an_outage() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    store.corrupt.add(2)
    outcome = await rec.converge_once()
    assert outcome.reason == reasons.CORRUPT and rec.retry_in_s == 5.0
    assert rec.status.report().control_plane_up is True
    assert rec.status.report().desired == 2
    assert [e["revision"] for e in events_of(seen) if e["type"] == "rejected"] == [2]
    # Final: not hydrated again while desired stays.
    store.calls.clear()
    again = await rec.converge_once()
    assert again.repeated and [what for what, _ in store.calls] == ["desired"]


async def test_a_transient_store_refusal_is_retried_with_backoff() -> None:
    class Conflicting(FakeStore):
        async def hydrate(self) -> Any:
            raise ControlPlaneError("serialization failure", category=FailureCategory.CONFLICT)

    store = Conflicting()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=1.0, backoff_max_s=30.0)
    outcome = await rec.converge_once()
    assert outcome.reason == reasons.CONFLICT
    assert rec.retry_in_s is not None and rec.retry_in_s <= 1.0


async def test_the_active_state_is_swapped_with_the_body_digest() -> None:
    body = doc("a")
    store = FakeStore()
    store.put(body)
    state = ActiveState()
    rec = make(store, state=state)
    await rec.converge_once()
    assert state.body_sha256 == hashlib.sha256(body).digest()
    assert rec.status.report().last_convergence_s is not None


# -- retries, refusals and sinks: each asserts a visible effect ----------------------------


class ThreadRecordingResolver:
    """Records whether each secret was resolved on the event loop's thread."""

    def __init__(self) -> None:
        self.on_loop_thread: list[bool] = []

    def resolve(self, reference: str) -> bytes:
        import threading

        self.on_loop_thread.append(threading.current_thread() is threading.main_thread())
        return b"value-of-" + reference.encode()


def padded(size: int) -> bytes:
    """A valid document of exactly ``size`` bytes (one key; aliases and blanks fill it)."""
    base = json.loads(doc("a", keys={"k": ["a"]}))
    entry = len(json.dumps({"pad000000": {"upstream": "https://pad000000.internal/v1"}})) - 1
    for n in range((size - 200) // (entry + 3)):
        base["aliases"][f"pad{n:06d}"] = {"upstream": f"https://pad{n:06d}.internal/v1"}
    text = json.dumps(base).encode()
    assert len(text) <= size
    return text + b" " * (size - len(text))


async def test_a_body_over_one_mebibyte_is_compiled_off_the_event_loop() -> None:
    small, large = padded(1024 * 1024 - 2000), padded(1024 * 1024 + 100)
    for body, off_loop in ((small, False), (large, True)):
        resolver = ThreadRecordingResolver()
        store = FakeStore()
        store.put(body)
        rec = make(store, resolver=resolver)
        assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED
        assert resolver.on_loop_thread == [not off_loop], len(body)


async def test_a_large_compile_is_abandoned_on_cancellation() -> None:
    import threading

    release = threading.Event()

    class Blocking:
        def resolve(self, reference: str) -> bytes:
            release.wait(20)
            return b"v"

    store = FakeStore()
    store.put(padded(1024 * 1024 + 100))
    rec = make(store, resolver=Blocking())
    try:
        start = trio.current_time()
        with trio.move_on_after(0.2):
            await rec.converge_once()
        assert trio.current_time() - start < 5  # not held until the thread finishes
    finally:
        release.set()
    assert rec.state.snapshot is None


async def test_converged_outcomes_take_no_time_and_epochs_forget_refusals() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    assert (await rec.converge_once()).took_s == 0.0
    store.put(doc("a", keys={"k": ["nope"]}))
    await rec.converge_once()
    assert (await rec.converge_once()).repeated
    store.identity = "fake:2"  # a restore: a new epoch judges the revision afresh
    store.calls.clear()
    outcome = await rec.converge_once()
    assert not outcome.repeated and "hydrate" in [what for what, _ in store.calls]
    assert len([e for e in events_of(seen) if e["type"] == "rejected"]) == 2


async def test_the_first_successful_sink_write_is_not_a_recovery(tmp_path: Path) -> None:
    from supervisor.sinks.file import SnapshotFile

    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, snapshot_file=SnapshotFile(str(tmp_path / "snap.json")))
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()
    assert not [e for e in logs if e["event"] == "sink write recovered"]


async def test_incompatible_and_too_large_refusals_are_final_until_desired_moves() -> None:
    from supervisor.controlplane.errors import TooLarge

    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(json.dumps({"schema_version": 9}).encode())
    assert (await rec.converge_once()).reason == reasons.INCOMPATIBLE
    store.calls.clear()
    assert (await rec.converge_once()).repeated
    assert [what for what, _ in store.calls] == ["desired"]

    class Huge(FakeStore):
        async def hydrate(self) -> Any:
            self._check("hydrate")
            raise TooLarge(self.desired_id, 10**9, 16 * 1024 * 1024)

    huge = Huge()
    huge.put(doc("a"))
    rec = make(huge)
    assert (await rec.converge_once()).reason == reasons.DENIED
    huge.calls.clear()
    assert (await rec.converge_once()).repeated
    assert [what for what, _ in huge.calls] == ["desired"]


async def test_a_denied_read_of_the_desired_revision_is_retried_every_poll() -> None:
    class Denied(FakeStore):
        async def hydrate(self) -> Any:
            self._check("hydrate")
            raise ControlPlaneError("permission denied for table", revision=self.desired_id,
                                    category=FailureCategory.DENIED)

    store = Denied()
    store.put(doc("a"))
    changes: list[bool] = []
    rec = make(store, on_outage_change=changes.append)
    first = await rec.converge_once()
    assert first.reason == reasons.DENIED and rec.retry_in_s == 5.0
    store.calls.clear()
    again = await rec.converge_once()
    assert not again.repeated and "hydrate" in [what for what, _ in store.calls]
    assert changes == []  # a refusal, not an outage


async def test_a_refusal_without_a_revision_is_logged_as_a_refusal_not_an_outage() -> None:
    class Denied(FakeStore):
        async def observe(self) -> Any:
            self._check("desired")
            raise ControlPlaneError("permission denied", category=FailureCategory.DENIED)

    changes: list[bool] = []
    rec = make(Denied(), on_outage_change=changes.append)
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
    assert outcome.reason == reasons.DENIED
    assert changes == []
    events = [e["event"] for e in logs if e["log_level"] in ("warning", "error")]
    assert events == ["convergence attempt refused by the control plane; previous snapshot "
                      "keeps serving"]


async def test_a_different_refusal_without_a_revision_is_logged_at_once() -> None:
    class Refusing(FakeStore):
        error = ControlPlaneError("permission denied", category=FailureCategory.DENIED)

        async def observe(self) -> Any:
            raise self.error

    store = Refusing()
    rec = make(store)
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()
        await rec.converge_once()  # the same refusal within a minute: not logged again
        store.error = ControlPlaneError("malformed desired pointer",
                                        category=FailureCategory.INVALID)
        await rec.converge_once()  # another refusal: a new streak, logged at once
    refused = [e["detail"] for e in logs if e["log_level"] == "warning"]
    assert refused == ["permission denied", "malformed desired pointer"]


async def test_hydrate_failures_set_reachability_and_what_is_desired() -> None:
    class HydrateDown(FakeStore):
        down = False
        denied = False

        async def hydrate(self) -> Any:
            if self.down:
                raise ControlPlaneError("connection reset", category=FailureCategory.UNAVAILABLE)
            if self.denied:
                raise ControlPlaneError("permission denied for table supervisor_desired",
                                        category=FailureCategory.DENIED)
            return await super().hydrate()

    store = HydrateDown()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    store.down = True
    await rec.converge_once()  # observe answers, hydrate does not
    assert rec.status.report().control_plane_up is False
    assert sample(rec.metrics, "supervisor_control_plane_up") == 0
    # A refusal about a revision proves the control plane answers, and says what is desired.
    store.down = False
    store.put(doc("a", "c"))
    store.corrupt.add(3)
    outcome = await rec.converge_once("notify")
    assert outcome.reason == reasons.CORRUPT
    assert rec.status.report().control_plane_up is True
    assert rec.status.report().desired == 3
    assert sample(rec.metrics, "supervisor_desired_revision") == 3
    # A refusal about no revision (the pointer's read denied) says nothing of what is desired.
    store.put(doc("a", "d"))
    store.denied = True
    outcome = await rec.converge_once("notify")
    assert (outcome.reason, outcome.revision) == (reasons.DENIED, None)
    assert rec.status.report().desired == 4


async def test_a_cleared_desired_revision_is_reported_as_none() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    assert sample(rec.metrics, "supervisor_desired_revision") == 1
    store.desired_id = None
    assert (await rec.converge_once()).kind is OutcomeKind.EMPTY
    assert rec.status.report().desired is None
    assert sample(rec.metrics, "supervisor_desired_revision") == 0
    store.desired_id = 1
    await rec.converge_once()
    store.desired_id = None
    assert (await rec.converge_once("notify")).kind is OutcomeKind.EMPTY  # hydrate's view
    assert rec.status.report().desired is None


async def test_a_failed_export_is_counted_and_a_removal_only_logged_when_done() -> None:
    from tests.convergence import with_cache

    store = FakeStore()
    store.put(doc("a"))
    rec, cache = with_cache(store)
    cache.fail = True
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()  # nothing newer to remove
    assert sample(rec.metrics, LKG, event="export_failed") == 1
    assert not [e for e in logs if e["event"].startswith("removed a cache newer")]


async def test_repeated_refusals_keep_their_reason_and_first_report() -> None:
    store = FakeStore()
    store.put(doc("a", keys={"k": ["nope"]}))
    rec = make(store)
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()
    first = rec.status.report().last_rejection
    again = await rec.converge_once()
    assert again.repeated
    report = rec.status.report()
    assert report.last_rejection == first  # the same refusal, not a new one
    assert report.last_error.startswith("projection: $.keys.k.aliases[0]")
    retry = [e["retry_in_s"] for e in logs if "retry_in_s" in e]
    assert retry and all(r == round(r, 3) for r in retry)


async def test_a_wakeup_right_after_a_success_is_served_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=3600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        await trio.sleep(10)
        store.put(doc("a", "b"))
        rec.signal.notify("notify")
        while rec.state.generation < 2:
            await trio.sleep(0.001)
        store.put(doc("a", "c"))  # at once again, right after that success
        start = trio.current_time()
        rec.signal.notify("notify")
        while rec.state.generation < 3:
            await trio.sleep(0.001)
        assert trio.current_time() - start < 0.01
        nursery.cancel_scope.cancel()


async def test_a_sub_second_backoff_floor_still_holds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=0.5, backoff_max_s=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(rec.run)
        store.outage = True
        store.calls.clear()
        for _ in range(100):
            rec.signal.notify("sighup")
            await trio.sleep(0.05)
        times = [t for _, t in store.calls]
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(gaps) >= 2 and min(gaps) >= 0.5 - 1e-9


async def test_refusals_at_boot_reach_the_status_and_metrics(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    store.corrupt.add(1)
    rec = make(store)
    with pytest.raises(BootRefused):
        await rec.bootstrap()
    assert rec.status.report().last_rejection.reason == reasons.CORRUPT
    assert sample(rec.metrics, "supervisor_revision_rejections_total", reason="corrupt") == 1
    exported(tmp_path, doc("a"))
    rec = make(FakeStore(outage=True), cache=real_cache(tmp_path))
    await rec.bootstrap()
    assert sample(rec.metrics, "supervisor_revision_rejections_total", reason="unavailable") == 1
    assert rec.status.report().last_convergence_s == 0.0


# -- the current loop's additions: cache gauge, lost pointer, vanished sinks, refused desired ---


async def test_the_serving_cache_gauge_follows_the_source(tmp_path: Path) -> None:
    body = doc("a")
    store = FakeStore(outage=True)
    store.revisions[1] = body
    store.desired_id = 1
    exported(tmp_path, body)
    rec = make(store, cache=real_cache(tmp_path))
    await rec.bootstrap()
    assert sample(rec.metrics, "supervisor_serving_last_known_good") == 1
    store.outage = False
    await rec.converge_once()
    assert sample(rec.metrics, "supervisor_serving_last_known_good") == 0


async def test_a_lost_desired_pointer_is_told_once_while_serving() -> None:
    told = "the control plane has no desired revision any more"
    empty = make(FakeStore())
    with structlog.testing.capture_logs() as logs:
        await empty.converge_once()
    assert not [e for e in logs if e["event"].startswith(told)]
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.desired_id = None
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()
        await rec.converge_once()
    [line] = [e for e in logs if e["event"].startswith(told)]
    assert line["previously_desired"] == 1 and line["active"] == 1


async def test_vanished_sink_files_are_written_again(tmp_path: Path) -> None:
    from supervisor.sinks.file import SnapshotFile

    store = FakeStore()
    store.put(doc("a"))
    cache = real_cache(tmp_path)
    target = tmp_path / "snap.json"
    rec = make(store, cache=cache, snapshot_file=SnapshotFile(str(target)))
    await rec.converge_once()
    assert target.exists() and Path(cache.path).exists()
    target.unlink()
    Path(cache.path).unlink()
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert target.exists() and json.loads(target.read_bytes())["revision"] == 1
    loaded = real_cache(tmp_path).load()
    assert loaded is not None and loaded.revision == 1


async def test_a_refused_desired_revision_boots_the_cache_only_when_asked(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    store.put(doc("a", "b"))
    store.corrupt.add(2)
    exported(tmp_path, doc("a"), revision=1)
    rec = make(store, cache=real_cache(tmp_path), serve_cache_on_refusal=True)
    outcome = await rec.bootstrap()
    assert outcome.revision == 1 and rec.status.report().source == "last_known_good"
    with pytest.raises(BootRefused) as info:
        await make(store, serve_cache_on_refusal=True).bootstrap()  # no cache configured
    assert info.value.refusal == reasons.CORRUPT

    class Denied(FakeStore):
        async def observe(self) -> Any:
            self._check("desired")
            raise ControlPlaneError("permission denied", category=FailureCategory.DENIED)

    # A refusal that is not about the desired revision is not the revision's fault.
    with pytest.raises(BootRefused) as info:
        await make(Denied(), cache=real_cache(tmp_path), serve_cache_on_refusal=True).bootstrap()
    assert info.value.refusal == reasons.DENIED
