"""The first attempt of a run: publish from the control plane, or boot from the cache, or refuse.

Every boot refusal names its cause (empty, corrupt, projection, unavailable
without a cache, a schema newer than this build as a configuration error);
the cache serves when the control plane is unreachable or the desired
revision cannot be compiled (incompatible, a secret unavailable), or when
asked to for a refused one, and is refused itself with a reason (skew, a
rollback, uncompilable, no file); the revision is republished from the
control plane once it answers. A refusal the cache answers is still counted
and reported; a boot clears a crashed child's failures; ``run`` reports started
only after the first publish and never boots a restarted child again. Fake
store, real signed cache on a temporary directory (or a fake one raising the
cache's own errors), virtual time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory, SchemaTooNew
from supervisor.convergence.outcome import OutcomeKind
from supervisor.convergence.status import RevisionStatus
from supervisor.errors import BootRefused, ConfigError
from supervisor.sinks.lkg import CacheError, CacheSkew
from supervisor.sinks.state import ActiveState
from tests.convergence import (
    LKG_EVENTS,
    UnavailableResolver,
    doc,
    events_of,
    exported,
    make,
    real_cache,
    sample,
    watched,
)
from tests.fakes.store import FakeStore, RefusingStore, SlowStore


async def test_each_boot_refusal_without_a_cache_names_its_cause() -> None:
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
    with pytest.raises(ConfigError) as info:
        await make(RefusingStore(observe_error=SchemaTooNew(9, 2))).bootstrap()
    assert info.value.path == "$.control_plane.url"
    assert isinstance(info.value.__cause__, SchemaTooNew)
    assert info.value.reason == str(info.value.__cause__)


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
    assert sample(rec.report.metrics, LKG_EVENTS, event="restored") == 1
    assert sample(rec.report.metrics, LKG_EVENTS, event="refused") == 0
    assert sample(rec.report.metrics, "supervisor_active_revision") == 3
    assert sample(rec.report.metrics, "supervisor_active_generation") == 1
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
    assert sample(rec.report.metrics, LKG_EVENTS, event="exported") == 1
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert cache.load() is not None


async def test_the_serving_cache_gauge_follows_the_source(tmp_path: Path) -> None:
    body = doc("a")
    store = FakeStore(outage=True)
    store.revisions[1] = body
    store.desired_id = 1
    exported(tmp_path, body)
    rec = make(store, cache=real_cache(tmp_path))
    await rec.bootstrap()
    assert sample(rec.report.metrics, "supervisor_serving_last_known_good") == 1
    store.outage = False
    await rec.converge_once()
    assert sample(rec.report.metrics, "supervisor_serving_last_known_good") == 0


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


async def test_a_boot_refusal_the_cache_answers_is_still_counted_and_reported(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    store.put(doc("a", keys={"k": ["a"]}))
    exported(tmp_path, doc("a"))
    rec, seen = watched(store, cache=real_cache(tmp_path), resolver=UnavailableResolver())
    outcome = await rec.bootstrap()
    assert outcome.kind is OutcomeKind.PUBLISHED
    report = rec.status.report()
    assert report.source == "last_known_good"
    assert report.consecutive_failures == 1
    assert report.last_error == "unavailable: $.keys.k.secret: EMFILE: too many open files"
    assert sample(rec.report.metrics, "supervisor_revision_rejections_total",
                  reason="unavailable") == 1
    rejected = [e for e in events_of(seen) if e["type"] == "rejected"]
    assert [(e["revision"], e["reason"]) for e in rejected] == [(1, "unavailable")]


async def test_an_unavailable_secret_at_boot_restores_from_the_cache(tmp_path: Path) -> None:
    body = doc("a", keys={"k": ["a"]})
    store = FakeStore()
    store.put(body)
    exported(tmp_path, body)
    rec = make(store, cache=real_cache(tmp_path), resolver=UnavailableResolver())
    # The cache compiles with the same resolver: the secret stage refuses it.
    with pytest.raises(BootRefused) as info:
        await rec.bootstrap()
    assert info.value.refusal == "cache"
    assert "does not compile" in str(info.value)


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

    # A refusal that is not about the desired revision is not the revision's fault.
    denied = RefusingStore(observe_error=ControlPlaneError("permission denied",
                                                           category=FailureCategory.DENIED))
    with pytest.raises(BootRefused) as info:
        await make(denied, cache=real_cache(tmp_path), serve_cache_on_refusal=True).bootstrap()
    assert info.value.refusal == reasons.DENIED


async def test_boot_without_a_cache_file_is_refused_with_the_cause(tmp_path: Path) -> None:
    rec, seen = watched(FakeStore(outage=True), cache=real_cache(tmp_path))
    with pytest.raises(BootRefused) as info:
        await rec.bootstrap()
    assert info.value.refusal == reasons.UNAVAILABLE
    assert "cache file does not exist yet" in str(info.value)
    assert rec.state.snapshot is None
    assert seen.status == []
    assert sample(rec.report.metrics, LKG_EVENTS, event="refused") == 0


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
    assert sample(rec.report.metrics, LKG_EVENTS, event="refused") == 1
    assert sample(rec.report.metrics, LKG_EVENTS, event="restored") == 0


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
    assert sample(rec.report.metrics, LKG_EVENTS, event="refused") == 1
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
    assert sample(rec.report.metrics, LKG_EVENTS, event="refused") == 1


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


async def test_refusals_at_boot_reach_the_status_and_metrics(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    store.corrupt.add(1)
    rec = make(store)
    with pytest.raises(BootRefused):
        await rec.bootstrap()
    assert rec.status.report().last_rejection.reason == reasons.CORRUPT
    assert sample(rec.report.metrics, "supervisor_revision_rejections_total", reason="corrupt") == 1
    exported(tmp_path, doc("a"))
    rec = make(FakeStore(outage=True), cache=real_cache(tmp_path))
    await rec.bootstrap()
    assert sample(rec.report.metrics, "supervisor_revision_rejections_total", reason="unavailable") == 1
    assert rec.status.report().last_convergence_s == 0.0


async def test_a_successful_boot_is_counted_and_clears_failures(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    mock_clock.jump(100)
    outcome = await rec.bootstrap()
    assert outcome.kind is OutcomeKind.PUBLISHED
    assert sample(rec.report.metrics, "supervisor_convergence_attempts_total", outcome="published") == 1
    report = rec.status.report()
    assert report.consecutive_failures == 0 and report.source == "control_plane"
    assert seen.status == ["serving revision 1 (generation 1, control_plane)"]
    assert rec.status.stalled_for() == 0


async def test_a_boot_after_a_crashed_child_clears_its_failures() -> None:
    status = RevisionStatus(ActiveState())
    status.failed(None, reasons.UNAVAILABLE, "connection refused", refusal=False)
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, status=status)
    assert (await rec.bootstrap()).kind is OutcomeKind.PUBLISHED
    report = rec.status.report()
    assert (report.consecutive_failures, report.last_error) == (0, None)


async def test_run_reports_started_only_after_the_first_publish(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = SlowStore(delay_s=1.0)  # reads take time, as a real store's do
    store.put(doc("a"))
    rec = make(store)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            assert rec.state.snapshot is not None and rec.status.source == "control_plane"
            nursery.cancel_scope.cancel()


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


async def test_the_cached_revision_published_again_from_the_control_plane_is_no_id_reuse(
    tmp_path: Path,
) -> None:
    # Booted from the cache during an outage; the control plane comes back
    # desiring the very revision the cache holds (same id, same body).
    body = doc("a")
    store = FakeStore(outage=True)
    store.put(body)
    cache = real_cache(tmp_path)
    cache.export(revision=1, generation=1, schema_version=1, body=body)
    rec = make(store, cache=cache)
    await rec.bootstrap()
    assert rec.state.source == "last_known_good"
    store.outage = False
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.PUBLISHED and rec.state.source == "control_plane"
    assert not [e for e in logs if e["event"].startswith("revision id reused")]
