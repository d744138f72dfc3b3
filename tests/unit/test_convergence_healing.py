"""The convergence loop tells the truth and heals, on virtual time.

Against the fake store of ``test_convergence_loop`` (our own seam) and a fake cache
that implements the cache's surface; every test asserts a visible effect
(outcome, status, sinks, log lines, metrics), never call order.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.convergence.loop import ConvergenceLoop
from supervisor.convergence.outcome import OutcomeKind
from supervisor.revision.errors import RevisionError
from supervisor.revision.secrets import EnvFileResolver
from supervisor.sinks.file import SnapshotFile
from supervisor.sinks.lkg import CacheUnwritable
from supervisor.status_doc import RevisionReport
from tests.convergence import doc, make, real_cache, sample, with_cache
from tests.fakes.store import FakeStore

# -- a revision is its content -------------------------------------------


async def test_reused_id_with_new_content_is_a_new_revision() -> None:
    store = FakeStore()
    store.put(doc("a0", "a1"))
    store.put(doc("a0", "a1"))
    store.put(doc("a0", "a1"))
    rec = make(store)
    assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED
    assert rec.state.snapshot is not None and rec.state.snapshot.revision == 3
    # A restore: desired back to 1, ids above it deleted, the sequence restarted,
    # two new bodies published (ids 2 and 3; the new 3 has more aliases).
    del store.revisions[2], store.revisions[3]
    store.desired_id = 1
    store.put(doc("a0"))
    store.put(doc(*[f"a{i}" for i in range(7)]))
    assert store.desired_id == 3
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.PUBLISHED and outcome.revision == 3
    assert sorted(rec.state.snapshot.aliases) == [f"a{i}" for i in range(7)]
    assert any(e["event"].startswith("revision id reused") for e in logs)
    # The LISTEN fast path (no observe) goes through the same identity.
    store.revisions[3] = doc("z")
    assert (await rec.converge_once("notify")).kind is OutcomeKind.PUBLISHED
    assert sorted(rec.state.snapshot.aliases) == ["z"]
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED


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


async def test_identity_change_starts_an_epoch_and_rewrites_the_sinks() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, cache = with_cache(store)
    await rec.converge_once()
    assert [r for r, _ in cache.exported] == [1]
    store.identity = "fake:2"  # same id and body, another database (a restore)
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.CONVERGED
    assert any("identity changed" in e["event"] for e in logs)
    assert [r for r, _ in cache.exported] == [1, 1]  # re-written for the new epoch
    await rec.converge_once()
    assert len(cache.exported) == 2  # once per epoch, not per poll


# -- status tells the truth --------------------------------------------


async def test_notification_refusal_updates_desired_and_last_rejection() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    bad = store.put(doc("a", keys={"k": ["missing-alias"]}))
    outcome = await rec.converge_once("notify")  # no observe read before the hydrate
    assert outcome.failed and outcome.reason == reasons.PROJECTION
    report = rec.status.report()
    assert report.desired == bad and report.active == 1
    assert report.loaded == 1  # the refused candidate never shows as loaded
    assert report.last_rejection.revision == bad
    assert sample(rec.metrics, "supervisor_desired_revision") == bad


async def test_store_level_refusal_replaces_an_older_rejection() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", keys={"k": ["nope"]}))
    await rec.converge_once()
    assert rec.status.report().last_rejection.reason == reasons.PROJECTION

    async def denied() -> None:
        raise ControlPlaneError("permission denied for table supervisor_desired",
                                category=FailureCategory.DENIED)

    store.observe = denied  # type: ignore[method-assign]
    outcome = await rec.converge_once()
    rejection = rec.status.report().last_rejection
    assert outcome.failed and rejection.reason == reasons.DENIED
    assert rejection.revision is None


async def test_an_outage_is_not_a_rejection() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.outage = True
    await rec.converge_once()
    report = rec.status.report()
    assert report.last_rejection is None and report.control_plane_up is False
    assert report.last_error.startswith("unavailable")


async def test_refusal_line_carries_retry_in_s() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", keys={"k": ["nope"]}))
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()
    [line] = [e for e in logs if e["event"].startswith("revision refused")]
    assert line["retry_in_s"] == rec.retry_in_s == 5.0
    assert line["reason"] == reasons.PROJECTION


# -- refusals do not wedge -----------------------------------------------


async def test_refused_candidate_waits_the_poll_interval_not_the_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=4.0, backoff_max_s=30.0)
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            store.put(doc("a", keys={"k": ["nope"]}))
            for _ in range(6):  # six refusals in a row: a backoff would reach 30 s
                await trio.sleep(5.0)
            fixed = store.put(doc("a", "b"))
            published = trio.current_time()
            while rec.status.active != fixed:
                await trio.sleep(0.1)
            assert trio.current_time() - published <= 5.0 + 0.1
            nursery.cancel_scope.cancel()


async def test_final_refusal_is_not_hydrated_again_until_desired_moves() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    bad = store.put(doc("a", keys={"k": ["nope"]}))
    await rec.converge_once()
    hydrates = sum(1 for what, _ in store.calls if what == "hydrate")
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):
            outcome = await rec.converge_once()
            assert outcome.failed and outcome.revision == bad and outcome.repeated
    assert sum(1 for what, _ in store.calls if what == "hydrate") == hydrates
    assert not [e for e in logs if e["event"].startswith("revision refused")]  # < 1/min
    assert rec.status.consecutive_failures == 6
    assert sample(rec.metrics, "supervisor_revision_rejections_total",
                  reason=reasons.PROJECTION) == 1
    store.put(doc("a", "c"))
    assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED


async def test_secret_refusal_is_retried_every_poll() -> None:
    store = FakeStore()
    environ: dict[str, str] = {}
    rec = make(store, resolver=EnvFileResolver(environ))
    environ["SECRET_OK"] = "x"
    store.put(doc("a", keys={"ok": ["a"]}))
    await rec.converge_once()
    rid = store.put(doc("a", keys={"ok": ["a"], "late": ["a"]}))
    assert (await rec.converge_once()).reason == reasons.SECRET
    environ["SECRET_LATE"] = "y"  # the secret appears
    outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.PUBLISHED and outcome.revision == rid


async def test_transient_os_error_on_a_secret_file_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = tmp_path / "s"
    secret.write_text("v")
    real_open = __import__("os").open

    def exhausted(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path) == str(secret):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("supervisor.revision.secrets.os.open", exhausted)
    with pytest.raises(RevisionError) as info:
        EnvFileResolver({}).resolve(f"file:{secret}")
    assert info.value.reason == reasons.UNAVAILABLE
    monkeypatch.undo()
    assert EnvFileResolver({}).resolve(f"file:{secret}") == b"v"


# -- sinks catch up -------------------------------------------------


async def test_cache_is_exported_before_the_swap() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, cache = with_cache(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    await rec.converge_once()
    # At each export, the swap had not happened yet: the cache never lags.
    assert cache.exported == [(1, None), (2, 1)]


async def test_failed_sinks_are_retried_every_poll_until_they_succeed(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    rec, cache = with_cache(store, snapshot_file=SnapshotFile(str(blocked / "snap.json")))
    cache.fail = True
    await rec.converge_once()
    assert rec.state.snapshot is not None  # serving regardless
    assert cache.exported == []
    blocked.unlink()
    blocked.mkdir()
    cache.fail = False
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()  # converged: no new revision needed
    assert outcome.kind is OutcomeKind.CONVERGED
    assert (blocked / "snap.json").exists()
    assert [r for r, _ in cache.exported] == [1]
    assert sorted(e["sink"] for e in logs if e["event"] == "sink write recovered") == [
        "cache", "snapshot_file"]
    await rec.converge_once()
    assert len(cache.exported) == 1  # nothing due any more


async def test_sink_files_changed_in_place_are_written_again_once(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    target = tmp_path / "snap.json"
    rec, cache = with_cache(store, snapshot_file=SnapshotFile(str(target)))
    await rec.converge_once()
    whole = target.read_bytes()
    with target.open("r+b") as f:  # same inode, fewer bytes
        f.truncate(3)
    with open(cache.path, "r+b") as f:
        f.truncate(1)
    outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.CONVERGED
    assert target.read_bytes() == whole
    assert [r for r, _ in cache.exported] == [1, 1] and cache.forgotten == 1
    await rec.converge_once()
    await rec.converge_once()
    assert len(cache.exported) == 2  # written again once, not at every poll


async def test_failed_rollback_export_removes_the_newer_cache() -> None:
    store = FakeStore()
    store.put(doc("a"))
    store.put(doc("a", "b"))
    rec, cache = with_cache(store)
    await rec.converge_once()
    assert cache.revision == 2
    store.desired_id = 1  # the operator rolls back; the disk is full
    cache.fail = True
    outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.PUBLISHED and outcome.revision == 1
    assert cache.discarded == [2] and cache.revision is None


async def test_failed_export_of_a_reused_id_removes_the_cache_of_the_content_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    cache = real_cache(tmp_path)
    rec = make(store, cache=cache)
    await rec.converge_once()
    # A restore from a backup, then a publish: id 1 comes back with another body,
    # and the disk is full.
    store.revisions[1] = doc("b")

    def full(**_kw: Any) -> None:
        raise CacheUnwritable(cache.path, "No space left on device")

    monkeypatch.setattr(cache, "export", full)
    outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.PUBLISHED and sorted(rec.state.snapshot.aliases) == ["b"]
    # A boot with the control plane down must not serve the body the operator replaced.
    cached = cache.load()
    assert cached is None or cached.body == doc("b")


async def test_restarted_loop_rewrites_the_sinks_of_what_serves(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    first, cache = with_cache(store)
    await first.converge_once()
    target = tmp_path / "snap.json"
    # A new child run (after a crash) shares the serving state, nothing else.
    second = make(store, status=first.status, cache=cache,
                  snapshot_file=SnapshotFile(str(target)))
    outcome = await second.converge_once()
    assert outcome.kind is OutcomeKind.CONVERGED
    assert target.exists() and [r for r, _ in cache.exported] == [1, 1]
    assert first.state.generation == 1  # no new generation for the same revision


# -- outages are told once -------------------------------------------------


async def test_two_minute_outage_logs_start_progress_and_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    changes: list[bool] = []
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=0.25, backoff_max_s=30.0,
               on_outage_change=changes.append)
    with trio.fail_after(600), structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            store.outage = True
            await trio.sleep(120)
            store.outage = False
            while rec.status.control_plane_up is not True:
                await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
    events = [e["event"] for e in logs if e["log_level"] in ("warning", "info", "error")]
    outage = [e for e in events if "control plane" in e and "reachable" in e]
    assert outage[0] == "control plane unreachable"
    assert 1 <= outage.count("control plane still unreachable") <= 2  # once a minute
    assert outage[-1] == "control plane reachable again"
    [end] = [e for e in logs if e["event"] == "control plane reachable again"]
    assert end["after_s"] >= 120 and end["attempts"] >= 5
    assert changes == [True, False]  # the LISTEN child is poked at start and end


# -- the loop's own mechanics -----------------------------------------


async def test_backoff_floor_holds_against_wakeups_and_resets_on_success(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=2.0, backoff_max_s=30.0)
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            store.outage = True
            store.calls.clear()
            await trio.sleep(5.0)  # poll -> failure
            for _ in range(80):
                rec.signal.notify("sighup")  # a storm of wake-ups
                await trio.sleep(0.1)
            times = [t for what, t in store.calls]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert len(gaps) >= 2 and min(gaps) >= 2.0 - 1e-9  # never before the floor
            store.outage = False
            while rec.status.control_plane_up is not True:
                await trio.sleep(0.1)
            assert rec.schedule.backoff.failures == 0
            nursery.cancel_scope.cancel()


class YieldingStore(FakeStore):
    """A fake store whose reads take time, as a real one does."""

    async def observe(self) -> Any:
        await trio.sleep(1.0)
        return await super().observe()

    async def hydrate(self) -> Any:
        await trio.sleep(1.0)
        return await super().hydrate()


async def test_run_reports_started_only_after_the_first_publish(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = YieldingStore()
    store.put(doc("a"))
    rec = make(store)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            assert rec.state.snapshot is not None and rec.status.source == "control_plane"
            nursery.cancel_scope.cancel()


async def test_attempt_finished_is_recorded_for_liveness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await trio.sleep(50)
    assert rec.status.stalled_for() >= 50
    store.outage = True
    await rec.converge_once()  # a failed attempt is a finished attempt too
    assert rec.status.stalled_for() == 0


async def test_sighup_forgets_a_refusal_even_when_the_poll_is_shorter_than_the_floor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    # A poll shorter than the backoff floor: the wake-up must still be taken.
    rec = make(store, poll_interval_s=0.2, backoff_initial_s=0.25, backoff_max_s=1.0)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            bad = store.put(doc("a", "b"))
            store.corrupt.add(bad)  # body does not match its digest
            while rec.status.last_rejection is None:
                await trio.sleep(0.05)
            store.corrupt.discard(bad)  # repaired in place: same id, same digest
            await trio.sleep(5)
            assert rec.status.active == 1  # the memo still answers for the key
            rec.signal.notify("sighup")
            while rec.status.active != bad:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()


async def test_sighup_is_not_lost_when_a_notification_is_already_pending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, poll_interval_s=3600.0)
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            bad = store.put(doc("a", "b"))
            store.corrupt.add(bad)
            rec.signal.request()  # an attempt that observes first: the refusal is memoized
            while rec.status.last_rejection is None:
                await trio.sleep(0.05)
            store.corrupt.discard(bad)  # repaired in place: same id, same digest
            rec.signal.request()
            await trio.sleep(1)
            assert rec.status.active == 1  # the memo answers for the key
            # Both arrive while the loop waits out its poll: a notification
            # (a LISTEN reconnect, a publish elsewhere), then the operator's SIGHUP.
            rec.signal.notify("notify")
            rec.signal.notify("sighup")
            with trio.move_on_after(30):
                while rec.status.active != bad:
                    await trio.sleep(0.05)
            assert rec.status.active == bad, "the SIGHUP's 'look again' was coalesced away"
            nursery.cancel_scope.cancel()


async def test_sink_files_whose_mode_changed_are_written_again(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    target = tmp_path / "snap.json"
    rec, cache = with_cache(store, snapshot_file=SnapshotFile(str(target)))
    await rec.converge_once()
    os.chmod(target, 0o600)  # local consumers can no longer read it
    os.chmod(cache.path, 0o666)  # a boot would refuse a world-writable cache
    await rec.converge_once()
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert [r for r, _ in cache.exported] == [1, 1]


async def serve_through_an_outage(rec: ConvergenceLoop, store: FakeStore, *,
                                  failed_attempts: int) -> None:
    """Publish what the store holds, fail ``failed_attempts`` times in an outage, end it."""
    await rec.converge_once()
    store.outage = True
    for _ in range(failed_attempts):
        await rec.converge_once()
    assert rec.status.report().consecutive_failures == failed_attempts
    store.outage = False


async def test_status_is_consistent_the_moment_a_recovery_is_served() -> None:
    """From the swap on, /status never pairs the new active revision with the outage's count.

    Found by CI (tests/chaos/test_postgres_outage.py): after an outage, a /status
    read while the snapshot file was being written said ``active`` = the new
    revision, ``lag_s`` 0 and ``consecutive_failures`` 4: the count was reset only
    when the whole attempt returned. The ``on_status`` hook runs at the swap, so it
    sees what any reader of /status sees from that moment.
    """
    store = FakeStore()
    store.put(doc("a"))
    seen: list[RevisionReport] = []
    holder: list[ConvergenceLoop] = []
    rec = make(store, on_status=lambda _text: seen.append(holder[0].status.report()))
    holder.append(rec)
    await serve_through_an_outage(rec, store, failed_attempts=4)
    second = store.put(doc("a", "b"))
    seen.clear()
    assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED
    at_swap = seen[-1]
    assert at_swap.active == second and at_swap.lag_s == 0.0
    assert at_swap.consecutive_failures == 0 and at_swap.last_error is None


async def test_recovery_without_a_new_revision_clears_the_failure_count() -> None:
    """An outage ends and the active revision is still the desired one: converged, no failures.

    No swap happens here, so only the end of the attempt can say it succeeded
    (a publish resets the count at its swap; this holds it without one).
    """
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await serve_through_an_outage(rec, store, failed_attempts=3)
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    report = rec.status.report()
    assert report.consecutive_failures == 0 and report.last_error is None
