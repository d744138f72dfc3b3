"""What an attempt publishes: a revision is swapped in, told converged, or nothing is desired.

A revision is its id and its body (an id reused for another body is a new
revision); desired moving back to what serves, or cleared, is reported as such;
the failure count ends at the swap that serves again; a shutdown during the
export still completes the publish; a body over a mebibyte is compiled in a
worker thread. Fake store, virtual time.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.convergence.loop import ConvergenceLoop
from supervisor.convergence.outcome import OutcomeKind
from supervisor.sinks.file import SnapshotFile
from supervisor.sinks.state import ActiveState
from supervisor.status_doc import RevisionReport
from tests.convergence import WrappedCache, doc, make, sample
from tests.fakes.store import FakeStore, MovedBetweenTheReads


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
    assert sample(rec.report.metrics, "supervisor_active_revision") == 1
    assert sample(rec.report.metrics, "supervisor_convergence_attempts_total", outcome="converged") == 1


async def test_an_empty_store_publishes_nothing() -> None:
    rec = make(FakeStore())
    assert (await rec.converge_once()).kind is OutcomeKind.EMPTY
    assert rec.state.snapshot is None


async def test_the_active_state_is_swapped_with_the_body_digest() -> None:
    body = doc("a")
    store = FakeStore()
    store.put(body)
    state = ActiveState()
    rec = make(store, state=state)
    await rec.converge_once()
    assert state.body_sha256 == hashlib.sha256(body).digest()
    assert rec.status.report().last_convergence_s is not None


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
    assert sample(rec.report.metrics, "supervisor_desired_revision") == 1


async def test_a_cleared_desired_revision_is_reported_as_none() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    assert sample(rec.report.metrics, "supervisor_desired_revision") == 1
    store.desired_id = None
    assert (await rec.converge_once()).kind is OutcomeKind.EMPTY
    assert rec.status.report().desired is None
    assert sample(rec.report.metrics, "supervisor_desired_revision") == 0
    store.desired_id = 1
    await rec.converge_once()
    store.desired_id = None
    assert (await rec.converge_once("notify")).kind is OutcomeKind.EMPTY  # hydrate's view
    assert rec.status.report().desired is None


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

    A /status read while the snapshot file is being written must not say ``active``
    = the new revision, ``lag_s`` 0 and ``consecutive_failures`` 4 (a count reset
    only when the whole attempt returns). The ``on_status`` hook runs at the swap,
    so it sees what any reader of /status sees from that moment.
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


class HeldCache(WrappedCache):
    """The signed cache, with an export that waits (in its worker thread) until released."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.entered = threading.Event()
        self.release = threading.Event()

    def export(self, **kw: Any) -> None:
        self.entered.set()
        self.release.wait(10)
        super().export(**kw)


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


class ThreadRecordingResolver:
    """Records whether each secret was resolved on the event loop's thread."""

    def __init__(self) -> None:
        self.on_loop_thread: list[bool] = []

    def resolve(self, reference: str) -> bytes:
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


async def test_a_revision_published_between_the_two_reads_is_the_one_converged_to(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = MovedBetweenTheReads()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    store.between = lambda moved: moved.put(doc("a", "c"))  # observed 2, hydrated 3
    outcome = await rec.converge_once()
    assert (outcome.kind, outcome.revision) == (OutcomeKind.PUBLISHED, 3)
    await trio.sleep(10)
    report = rec.status.report()
    assert (report.desired, report.active, report.lag_s) == (3, 3, 0.0)
