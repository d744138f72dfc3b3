"""The convergence loop's visible effects: outages ended, refusals retold, restarts, sink streaks.

A refused read after an outage says the control plane is back (status and
event); desired moving back to what serves is reported converged; SIGHUP makes
an unchanged refusal be logged again; a cancellation during the export still
leaves the snapshot file written (the publish step is shielded); a boot
refusal of the desired revision that the cache answers is still counted and
reported; the snapshot file is not rewritten while nothing changes; a restarted
loop rewrites only stale sinks; a sink's failure streak is logged once. Fake store,
real snapshot file and signed cache on a temporary directory; virtual time.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.admin.context import AdminContext
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.convergence.outcome import OutcomeKind
from supervisor.convergence.side_sinks import SinkStatus
from supervisor.convergence.status import RevisionStatus
from supervisor.events import EventBus
from supervisor.revision.errors import RevisionError
from supervisor.sinks.file import SnapshotFile
from supervisor.sinks.lkg import CacheUnwritable
from supervisor.sinks.state import ActiveState
from supervisor.status_doc import SinksReport
from supervisor.telemetry import Metrics
from tests.convergence import (
    doc,
    events_of,
    exported,
    make,
    real_cache,
    sample,
    watched,
    with_cache,
)
from tests.fakes.store import FakeStore

REFUSED_LINE = "revision refused; previous snapshot keeps serving"


async def test_a_refused_read_after_an_outage_says_the_control_plane_is_back() -> None:
    class DeniedHydrate(FakeStore):
        deny = False

        async def hydrate(self) -> Any:
            if self.deny:
                self._check("hydrate")
                raise ControlPlaneError("permission denied for table revisions",
                                        category=FailureCategory.DENIED)
            return await super().hydrate()

    store = DeniedHydrate()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    store.outage = True
    await rec.converge_once()
    assert rec.status.report().control_plane_up is False
    store.outage = False
    store.put(doc("a", "b"))
    store.deny = True
    # Observe answered; the hydrate's refusal keeps the control plane up.
    outcome = await rec.converge_once("notify")
    assert outcome.failed and outcome.reason == reasons.DENIED and outcome.revision is None
    assert rec.status.report().control_plane_up is True
    assert sample(rec.metrics, "supervisor_control_plane_up") == 1
    ups = [e["control_plane_up"] for e in events_of(seen) if e["type"] == "status"]
    assert ups == [True, False, True]


async def test_desired_moving_back_to_what_serves_is_reported_converged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", keys={"k": ["nope"]}))  # projection: final
    assert (await rec.converge_once()).reason == reasons.PROJECTION
    await trio.sleep(30)
    assert rec.status.report().lag_s == 30.0
    store.desired_id = 1  # the operator moves desired back to what serves
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    await trio.sleep(30)
    report = rec.status.report()
    assert (report.desired, report.active, report.lag_s) == (1, 1, 0.0)
    assert sample(rec.metrics, "supervisor_desired_revision") == 1


async def test_sighup_logs_an_unchanged_refusal_again_at_once() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", keys={"k": ["nope"]}))
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()
        await rec.converge_once()  # the same refusal within a minute: not logged again
        assert [e["event"] for e in logs].count(REFUSED_LINE) == 1
        await rec.converge_once("sighup")  # "look again": said again, whatever the minute
    refused = [e for e in logs if e["event"] == REFUSED_LINE]
    assert len(refused) == 2
    assert refused[1]["reason"] == reasons.PROJECTION and refused[1]["revision"] == 2


class HeldCache:
    """The signed cache, with an export that waits (in its worker thread) until released."""

    def __init__(self, tmp_path: Path) -> None:
        self.real = real_cache(tmp_path)
        self.path = self.real.path
        self.paths = self.real.paths
        self.signing_key_id = self.real.signing_key_id
        self.entered = threading.Event()
        self.release = threading.Event()

    def export(self, **kw: Any) -> None:
        self.entered.set()
        self.release.wait(10)
        self.real.export(**kw)

    def discard_if_newer(self, revision: int, body_sha256: bytes | None = None) -> bool:
        return self.real.discard_if_newer(revision, body_sha256)

    def forget_files(self) -> None:
        self.real.forget_files()


async def test_a_shutdown_during_the_export_still_swaps_and_writes_the_snapshot_file(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    cache = HeldCache(tmp_path)
    snapshot_file = SnapshotFile(str(tmp_path / "snapshot.json"))
    rec = make(store, cache=cache, snapshot_file=snapshot_file)
    scope = trio.CancelScope()

    async def converge() -> None:
        with scope:
            await rec.converge_once()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(converge)
            await trio.to_thread.run_sync(cache.entered.wait, 10)
            scope.cancel()  # a SIGTERM while the cache is being written
            await trio.sleep(0)
            cache.release.set()
    assert cache.release.is_set()
    assert rec.state.snapshot is not None and rec.state.snapshot.revision == 1
    assert rec.status.report().active == 1
    written = json.loads(Path(snapshot_file.path).read_bytes())
    assert written["revision"] == 1
    loaded = cache.real.load()
    assert loaded is not None and loaded.revision == 1


async def test_a_boot_refusal_the_cache_answers_is_still_counted_and_reported(
    tmp_path: Path,
) -> None:
    class FlakyResolver:
        def resolve(self, reference: str) -> bytes:
            raise RevisionError(reasons.UNAVAILABLE, "EMFILE: too many open files")

    store = FakeStore()
    store.put(doc("a", keys={"k": ["a"]}))
    exported(tmp_path, doc("a"))
    rec, seen = watched(store, cache=real_cache(tmp_path), resolver=FlakyResolver())
    outcome = await rec.bootstrap()
    assert outcome.kind is OutcomeKind.PUBLISHED
    report = rec.status.report()
    assert report.source == "last_known_good"
    assert report.consecutive_failures == 1
    assert report.last_error == "unavailable: $.keys.k.secret: EMFILE: too many open files"
    assert sample(rec.metrics, "supervisor_revision_rejections_total",
                  reason="unavailable") == 1
    rejected = [e for e in events_of(seen) if e["type"] == "rejected"]
    assert [(e["revision"], e["reason"]) for e in rejected] == [(1, "unavailable")]


async def test_the_snapshot_file_is_not_rewritten_while_nothing_changes(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    snapshot_file = SnapshotFile(str(tmp_path / "snapshot.json"))
    rec = make(store, snapshot_file=snapshot_file)
    await rec.converge_once()
    # Every write replaces the file (a new inode): an unchanged inode is no write.
    first = os.stat(snapshot_file.path).st_ino
    for _ in range(3):
        assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert os.stat(snapshot_file.path).st_ino == first
    store.put(doc("a", "b"))
    await rec.converge_once()
    assert os.stat(snapshot_file.path).st_ino != first
    assert json.loads(Path(snapshot_file.path).read_bytes())["revision"] == 2


async def test_a_notified_hydrate_after_an_outage_says_the_control_plane_is_back() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    store.outage = True
    await rec.converge_once()
    store.outage = False
    store.put(doc("a", "b"))
    assert (await rec.converge_once("notify")).kind is OutcomeKind.PUBLISHED
    ups = [e["control_plane_up"] for e in events_of(seen) if e["type"] == "status"]
    assert ups == [True, False, True]


async def test_a_final_refusal_met_by_a_notification_is_not_hydrated_again() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", keys={"k": ["nope"]}))
    assert (await rec.converge_once("notify")).reason == reasons.PROJECTION
    store.calls.clear()
    again = await rec.converge_once()
    assert again.repeated and again.reason == reasons.PROJECTION
    assert [what for what, _ in store.calls] == ["desired"]  # observed only, not hydrated


async def test_a_final_refusal_on_a_notification_is_remembered_for_the_observed_candidate(
) -> None:
    class Refusing(FakeStore):
        error: ControlPlaneError | None = None

        async def hydrate(self) -> Any:
            if self.error is not None:
                self._check("hydrate")
                raise self.error
            return await super().hydrate()

    store = Refusing()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    # A refusal that may clear by itself (retried every poll) about revision 2 ...
    store.error = ControlPlaneError("permission denied", category=FailureCategory.DENIED,
                                    revision=2)
    await rec.converge_once()
    # ... then, on a notification (observed first: the candidate is known), a final one.
    store.error = ControlPlaneError("digest mismatch", category=FailureCategory.CORRUPT,
                                    revision=2)
    assert (await rec.converge_once("notify")).reason == reasons.CORRUPT
    store.calls.clear()
    # The next poll observes the same id and digest: the refusal stands, no hydrate.
    again = await rec.converge_once()
    assert again.repeated and again.reason == reasons.CORRUPT
    assert [what for what, _ in store.calls] == ["desired"]


async def test_a_restarted_loop_does_not_rewrite_its_sinks_after_it_published(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    snapshot_file = SnapshotFile(str(tmp_path / "snapshot.json"))
    first = make(store, snapshot_file=snapshot_file)
    await first.converge_once()
    store.put(doc("a", "b"))
    # The child restarted: a new loop over what outlives it (the state and the status).
    restarted = make(store, status=first.status, snapshot_file=snapshot_file)
    assert (await restarted.converge_once()).kind is OutcomeKind.PUBLISHED
    written = os.stat(snapshot_file.path).st_ino
    assert (await restarted.converge_once()).kind is OutcomeKind.CONVERGED
    assert os.stat(snapshot_file.path).st_ino == written


async def test_a_restarted_loop_rewrites_a_stale_snapshot_file(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    snapshot_file = SnapshotFile(str(tmp_path / "snapshot.json"))
    first = make(store, snapshot_file=snapshot_file)
    await first.converge_once()
    Path(snapshot_file.path).write_text('{"revision": 0}')  # a crash between swap and file
    restarted = make(store, status=first.status, snapshot_file=snapshot_file)
    assert (await restarted.converge_once()).kind is OutcomeKind.CONVERGED
    assert json.loads(Path(snapshot_file.path).read_bytes())["revision"] == 1


async def test_a_boot_after_a_crashed_child_clears_its_failures() -> None:
    from supervisor.convergence.status import RevisionStatus
    from supervisor.sinks.state import ActiveState

    status = RevisionStatus(ActiveState())
    status.failed(None, reasons.UNAVAILABLE, "connection refused", refusal=False)
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, status=status)
    assert (await rec.bootstrap()).kind is OutcomeKind.PUBLISHED
    report = rec.status.report()
    assert (report.consecutive_failures, report.last_error) == (0, None)


class FlakyFile:
    """The snapshot file seam over a real file, failing while ``fail`` is set."""

    def __init__(self, path: str) -> None:
        self.real = SnapshotFile(path)
        self.path = path
        self.fail = False

    def write(self, snapshot: Any) -> os.stat_result:
        if self.fail:
            raise OSError(28, "No space left on device")
        return self.real.write(snapshot)


async def test_every_failure_streak_of_a_sink_is_logged_once_and_its_recovery_once(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    sink = FlakyFile(str(tmp_path / "snapshot.json"))
    rec = make(store, snapshot_file=sink)
    with structlog.testing.capture_logs() as logs:
        for revision in (doc("a"), doc("a", "b")):
            store.put(revision)
            for fail in (True, True, False, False):  # publish, retry, recover, nothing due
                sink.fail = fail
                await rec.converge_once()
    lines = [e["event"] for e in logs if e.get("sink") == "snapshot_file"]
    assert lines == ["sink write failed; still serving, retrying every poll",
                     "sink write recovered",
                     "sink write failed; still serving, retrying every poll",
                     "sink write recovered"]
    assert sample(rec.metrics, "supervisor_sink_write_failures_total",
                  sink="snapshot_file") == 4


async def test_each_sink_reports_ok_or_disabled_as_configured(tmp_path: Path) -> None:
    assert SinkStatus().report() == SinksReport("disabled", "disabled", None, None)
    store = FakeStore()
    store.put(doc("a"))
    only_file = make(store, snapshot_file=SnapshotFile(str(tmp_path / "snapshot.json")))
    await only_file.converge_once()
    assert only_file.sinks.status.report() == SinksReport("disabled", "ok", None, None)
    only_cache, _ = with_cache(store)
    await only_cache.converge_once()
    assert only_cache.sinks.status.report() == SinksReport("ok", "disabled", None, None)


async def test_a_failing_sink_reports_its_error_until_a_write_succeeds(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    sink = FlakyFile(str(tmp_path / "snapshot.json"))
    rec = make(store, snapshot_file=sink)
    sink.fail = True
    await rec.converge_once()
    assert rec.sinks.status.report() == SinksReport(
        "disabled", "failing", None, "[Errno 28] No space left on device")
    sink.fail = False
    await rec.converge_once()
    assert rec.sinks.status.report() == SinksReport("disabled", "ok", None, None)


async def test_a_restart_keeps_a_failing_sink_failing_and_one_left_out_is_disabled() -> None:
    store = FakeStore()
    store.put(doc("a"))
    sinks = SinkStatus()
    first, cache = with_cache(store, sink_status=sinks)
    cache.fail = True
    await first.converge_once()
    refused = str(CacheUnwritable(cache.path, "No space left on device"))
    assert (sinks.state("cache"), sinks.error("cache")) == ("failing", refused)
    # A restart with the cache: nothing was written since, so it is failing still.
    make(store, status=first.status, cache=cache, sink_status=sinks)
    assert (sinks.state("cache"), sinks.error("cache")) == ("failing", refused)
    # A restart that left the cache out (unusable): disabled, its streak and error gone.
    make(store, status=first.status, sink_status=sinks)
    assert (sinks.state("cache"), sinks.error("cache")) == ("disabled", None)
    make(store, status=first.status, cache=cache, sink_status=sinks)
    assert (sinks.state("cache"), sinks.error("cache")) == ("ok", None)


async def test_a_restart_while_the_control_plane_is_down_still_retries_a_failing_sink_write(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    sinks = SinkStatus()
    sink = FlakyFile(str(tmp_path / "snapshot.json"))
    first = make(store, snapshot_file=sink, sink_status=sinks)
    await first.converge_once()
    store.put(doc("a", "b"))
    sink.fail = True  # a full disk: revision 2 serves, the file still holds revision 1
    assert (await first.converge_once()).kind is OutcomeKind.PUBLISHED
    assert sinks.state("snapshot_file") == "failing"
    # The child restarts while the control plane is down; the disk has room again.
    store.outage = True
    sink.fail = False
    restarted = make(store, status=first.status, snapshot_file=sink, sink_status=sinks)
    assert (await restarted.converge_once()).kind is OutcomeKind.REJECTED
    assert json.loads(Path(sink.path).read_bytes())["revision"] == 2
    assert sinks.state("snapshot_file") == "ok"


class VanishingCache:
    """The signed cache, whose first export's files are removed the instant it returns
    (another process cleaning the directory): the write succeeded, nothing is left."""

    def __init__(self, tmp_path: Path) -> None:
        self.real = real_cache(tmp_path)
        self.path = self.real.path
        self.paths = self.real.paths
        self.signing_key_id = self.real.signing_key_id
        self.exports = 0

    def export(self, **kw: Any) -> None:
        self.real.export(**kw)
        self.exports += 1
        if self.exports == 1:
            for path in self.paths:
                os.unlink(path)

    def discard_if_newer(self, revision: int, body_sha256: bytes | None = None) -> bool:
        return self.real.discard_if_newer(revision, body_sha256)

    def forget_files(self) -> None:
        self.real.forget_files()


async def test_a_cache_gone_the_instant_it_was_written_is_written_again(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    cache = VanishingCache(tmp_path)
    rec = make(store, cache=cache)
    await rec.converge_once()
    assert cache.exports == 1 and not os.path.exists(cache.path)
    await rec.converge_once()  # nothing new to converge: the sinks catch up
    assert cache.exports == 2
    assert all(os.path.exists(path) for path in cache.paths)


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
