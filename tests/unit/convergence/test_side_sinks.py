"""The side sinks (the signed cache, the snapshot file): written for what serves, caught up.

The cache is exported before the swap; a failed write never blocks serving, is
retried every attempt until it succeeds, counted, and logged once per streak
with its recovery once; each sink reports ok, failing (with its error) or
disabled; a file is rewritten when it vanished, was changed in place or had its
mode changed, never while nothing changed; a new epoch and a restarted loop
rewrite only what is stale; a failed rollback export removes the newer cache.
Fake store, fake or real signed cache and real snapshot file on a temporary
directory.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import structlog

from supervisor.convergence import side_sinks
from supervisor.convergence.outcome import OutcomeKind
from supervisor.convergence.side_sinks import SinkStatus
from supervisor.sinks.file import SnapshotFile
from supervisor.sinks.lkg import CacheUnwritable
from supervisor.status_doc import SinksReport
from supervisor.threads import FILE_IO_DEADLINE_S, ThreadDeadline
from tests.convergence import LKG_EVENTS, WrappedCache, doc, make, real_cache, sample, with_cache
from tests.fakes.store import FakeStore


async def test_cache_is_exported_before_the_swap() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, cache = with_cache(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    await rec.converge_once()
    # At each export, the swap had not happened yet: the cache never lags.
    assert cache.exported == [(1, None), (2, 1)]


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
    assert sample(rec.report.metrics, "supervisor_sink_write_failures_total", sink="snapshot_file") == 6
    assert rec.state.snapshot is not None and rec.state.snapshot.revision == 4


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
    assert sample(rec.report.metrics, "supervisor_sink_write_failures_total",
                  sink="snapshot_file") == 4


async def test_the_first_successful_sink_write_is_not_a_recovery(tmp_path: Path) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, snapshot_file=SnapshotFile(str(tmp_path / "snap.json")))
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()
    assert not [e for e in logs if e["event"] == "sink write recovered"]


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


async def test_a_failed_export_is_counted_and_a_removal_only_logged_when_done() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, cache = with_cache(store)
    cache.fail = True
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()  # nothing newer to remove
    assert sample(rec.report.metrics, LKG_EVENTS, event="export_failed") == 1
    assert not [e for e in logs if e["event"].startswith("removed a cache newer")]


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


async def test_vanished_sink_files_are_written_again(tmp_path: Path) -> None:
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


class VanishingCache(WrappedCache):
    """The signed cache, whose first export's files are removed the instant it returns
    (another process cleaning the directory): the write succeeded, nothing is left."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.exports = 0

    def export(self, **kw: Any) -> None:
        super().export(**kw)
        self.exports += 1
        if self.exports == 1:
            for path in self.paths:
                os.unlink(path)


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


async def test_a_sink_file_whose_status_read_is_stuck_is_not_queued_for_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    target = tmp_path / "snap.json"
    rec = make(store, snapshot_file=SnapshotFile(str(target)))
    await rec.converge_once()
    target.unlink()
    files = side_sinks._files

    def stuck(fn: Any, what: str) -> Any:
        if what == "a sink file's status":  # a stuck disk: the stat never returns in time
            raise ThreadDeadline(what, FILE_IO_DEADLINE_S)
        return files(fn, what)

    monkeypatch.setattr(side_sinks, "_files", stuck)
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert not target.exists()  # the write it would cause could not finish either
    monkeypatch.undo()
    await rec.converge_once()  # the disk answers again: the vanished file is noticed
    assert json.loads(target.read_bytes())["revision"] == 1


class RecordingHook:
    """The reload hook as the sinks tell it: records the snapshot file's revision at each swap."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.told: list[int] = []

    def swapped(self) -> None:
        self.told.append(json.loads(self.path.read_bytes())["revision"])


async def test_the_reload_hook_is_told_of_each_swap_once_the_snapshot_file_holds_it(
    tmp_path: Path,
) -> None:
    target = tmp_path / "snap.json"
    hook = RecordingHook(target)
    sinks = SinkStatus()
    sinks.hook = hook  # type: ignore[assignment]
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store, snapshot_file=SnapshotFile(str(target)), sink_status=sinks)
    await rec.converge_once()
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED  # no swap: not told
    store.put(doc("a", "b"))
    await rec.converge_once()
    assert hook.told == [1, 2]


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


async def test_a_restart_while_the_control_plane_is_down_still_retries_a_failing_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = FakeStore()
    store.put(doc("a"))
    sinks = SinkStatus()
    cache = real_cache(tmp_path)
    first = make(store, cache=cache, sink_status=sinks)
    await first.converge_once()
    store.put(doc("a", "b"))
    export = cache.export

    def full(**_kw: Any) -> None:
        raise CacheUnwritable(cache.path, "No space left on device")

    monkeypatch.setattr(cache, "export", full)
    assert (await first.converge_once()).kind is OutcomeKind.PUBLISHED
    assert sinks.state("cache") == "failing"
    # The child restarts while the control plane is down; the disk has room again.
    store.outage = True
    monkeypatch.setattr(cache, "export", export)
    restarted = make(store, status=first.status, cache=cache, sink_status=sinks)
    assert (await restarted.converge_once()).kind is OutcomeKind.REJECTED
    cached = cache.load()
    assert cached is not None and cached.revision == 2
    assert sinks.state("cache") == "ok"


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
