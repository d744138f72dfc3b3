"""What a refused revision does: the previous snapshot serves on, and the refusal is told.

A refusal reaches the outcome, the status report, the events, the log line
(with its ``retry_in_s``) and the metrics; a refusal the control plane answers
with is no outage; a final refusal (projection, corrupt, incompatible, too
large) is remembered for its candidate and not hydrated again until desired
moves, an epoch changes or SIGHUP says look again; one that may clear by itself
(a secret, a denied read, a conflict) is retried every poll or with backoff.
Fake store, virtual time.
"""

from __future__ import annotations

import json

import pytest
import structlog
import trio
import trio.testing

from supervisor import reasons
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory, TooLarge
from supervisor.convergence.outcome import OutcomeKind
from supervisor.revision.secrets import EnvFileResolver
from tests.convergence import doc, events_of, make, sample, watched, with_cache
from tests.fakes.store import FakeStore, MovedBetweenTheReads, RefusingStore

REFUSED_LINE = "revision refused; previous snapshot keeps serving"
ANSWERED_LINE = "convergence attempt refused by the control plane; previous snapshot keeps serving"


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
    [line] = [entry for entry in logs if entry["log_level"] == "warning"]
    assert line["event"] == REFUSED_LINE
    assert line["reason"] == "projection" and line["revision"] == 2
    assert line["retry_in_s"] == rec.retry_in_s == 5.0
    assert sample(rec.report.metrics, "supervisor_revision_rejections_total", reason="projection") == 1
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
    assert sample(rec.report.metrics, "supervisor_desired_revision") == 2
    assert sample(rec.report.metrics, "supervisor_convergence_attempts_total", outcome="rejected") == 1
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
    assert sample(rec.report.metrics, "supervisor_desired_revision") == bad


async def test_store_level_refusal_replaces_an_older_rejection() -> None:
    store = RefusingStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", keys={"k": ["nope"]}))
    await rec.converge_once()
    assert rec.status.report().last_rejection.reason == reasons.PROJECTION
    store.observe_error = ControlPlaneError("permission denied for table supervisor_desired",
                                            category=FailureCategory.DENIED)
    outcome = await rec.converge_once()
    rejection = rec.status.report().last_rejection
    assert outcome.failed and rejection.reason == reasons.DENIED
    assert rejection.revision is None


@pytest.mark.parametrize("category", [FailureCategory.DENIED, FailureCategory.CONFLICT])
async def test_a_control_plane_that_answers_with_a_refusal_is_up_and_no_outage(
    category: FailureCategory,
) -> None:
    store = RefusingStore(observe_error=ControlPlaneError(
        "permission denied for table supervisor_desired", category=category))
    store.put(doc("a"))
    changes: list[bool] = []
    rec = make(store, on_outage_change=changes.append)
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
    assert outcome.reason == category.value
    report = rec.status.report()
    assert report.control_plane_up is True
    assert report.last_rejection.reason == category.value
    assert sample(rec.report.metrics, "supervisor_control_plane_up") == 1.0
    assert changes == []  # the LISTEN child is not poked: no outage began
    told = [e["event"] for e in logs if e["log_level"] in ("warning", "error")]
    assert told == [ANSWERED_LINE]


async def test_a_different_refusal_without_a_revision_is_logged_at_once() -> None:
    store = RefusingStore(observe_error=ControlPlaneError("permission denied",
                                                          category=FailureCategory.DENIED))
    rec = make(store)
    with structlog.testing.capture_logs() as logs:
        await rec.converge_once()
        await rec.converge_once()  # the same refusal within a minute: not logged again
        store.observe_error = ControlPlaneError("malformed desired pointer",
                                                category=FailureCategory.INVALID)
        await rec.converge_once()  # another refusal: a new streak, logged at once
    refused = [e["detail"] for e in logs if e["log_level"] == "warning"]
    assert refused == ["permission denied", "malformed desired pointer"]


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
    assert sample(rec.report.metrics, "supervisor_revision_rejections_total",
                  reason=reasons.PROJECTION) == 1
    store.put(doc("a", "c"))
    assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED


async def test_a_restarted_loop_hydrates_again_what_its_predecessor_refused_for_good() -> None:
    store = FakeStore()
    store.put(doc("a"))
    first = make(store)
    await first.converge_once()
    bad = store.put(doc("a", keys={"k": ["nope"]}))
    assert (await first.converge_once()).revision == bad
    assert (await first.converge_once()).repeated
    hydrates = sum(1 for what, _ in store.calls if what == "hydrate")
    # The child restarts (the status outlives it): it reads the refused revision once more.
    restarted = make(store, status=first.status)
    outcome = await restarted.converge_once()
    assert outcome.revision == bad and not outcome.repeated
    assert sum(1 for what, _ in store.calls if what == "hydrate") == hydrates + 1


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
    store = RefusingStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    # A refusal that may clear by itself (retried every poll) about revision 2 ...
    store.hydrate_error = ControlPlaneError("permission denied",
                                            category=FailureCategory.DENIED, revision=2)
    await rec.converge_once()
    # ... then, on a notification (observed first: the candidate is known), a final one.
    store.hydrate_error = ControlPlaneError("digest mismatch",
                                            category=FailureCategory.CORRUPT, revision=2)
    assert (await rec.converge_once("notify")).reason == reasons.CORRUPT
    store.calls.clear()
    # The next poll observes the same id and digest: the refusal stands, no hydrate.
    again = await rec.converge_once()
    assert again.repeated and again.reason == reasons.CORRUPT
    assert [what for what, _ in store.calls] == ["desired"]


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


async def test_incompatible_and_too_large_refusals_are_final_until_desired_moves() -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(json.dumps({"schema_version": 9}).encode())
    assert (await rec.converge_once()).reason == reasons.INCOMPATIBLE
    store.calls.clear()
    assert (await rec.converge_once()).repeated
    assert [what for what, _ in store.calls] == ["desired"]

    huge = RefusingStore()
    huge.put(doc("a"))
    huge.hydrate_error = TooLarge(1, 10**9, 16 * 1024 * 1024)
    rec = make(huge)
    assert (await rec.converge_once()).reason == reasons.DENIED
    huge.calls.clear()
    assert (await rec.converge_once()).repeated
    assert [what for what, _ in huge.calls] == ["desired"]


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


async def test_a_denied_read_of_the_desired_revision_is_retried_every_poll() -> None:
    store = RefusingStore()
    store.put(doc("a"))
    store.hydrate_error = ControlPlaneError("permission denied for table", revision=1,
                                            category=FailureCategory.DENIED)
    changes: list[bool] = []
    rec = make(store, on_outage_change=changes.append)
    first = await rec.converge_once()
    assert first.reason == reasons.DENIED and rec.retry_in_s == 5.0
    store.calls.clear()
    again = await rec.converge_once()
    assert not again.repeated and "hydrate" in [what for what, _ in store.calls]
    assert changes == []  # a refusal, not an outage


async def test_a_transient_store_refusal_is_retried_with_backoff() -> None:
    store = RefusingStore(hydrate_error=ControlPlaneError(
        "serialization failure", category=FailureCategory.CONFLICT))
    store.put(doc("a"))
    rec = make(store, poll_interval_s=5.0, backoff_initial_s=1.0, backoff_max_s=30.0)
    outcome = await rec.converge_once()
    assert outcome.reason == reasons.CONFLICT
    assert rec.retry_in_s is not None and rec.retry_in_s <= 1.0


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


async def test_a_revision_published_between_the_two_reads_and_refused_is_remembered() -> None:
    store = MovedBetweenTheReads()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    store.between = lambda moved: moved.put(doc("a", keys={"k": ["nope"]}))  # hydrated: 3
    outcome = await rec.converge_once()
    assert (outcome.reason, outcome.revision) == (reasons.PROJECTION, 3)
    assert rec.status.report().desired == 3
    store.calls.clear()
    again = await rec.converge_once()  # observes 3 now: the refusal stands
    assert again.repeated and again.revision == 3
    assert [what for what, _ in store.calls] == ["desired"]


async def test_a_refused_revision_desired_again_between_the_two_reads_is_not_compiled_again(
) -> None:
    store = MovedBetweenTheReads()
    store.put(doc("a"))
    rec, seen = watched(store)
    await rec.converge_once()
    bad = store.put(doc("a", keys={"k": ["nope"]}))
    await rec.converge_once()  # refused for good
    store.put(doc("a", "b"))
    store.between = lambda moved: setattr(moved, "desired_id", bad)  # observed 3, hydrated 2
    outcome = await rec.converge_once()
    assert outcome.repeated and (outcome.reason, outcome.revision) == (reasons.PROJECTION, bad)
    assert len([e for e in events_of(seen) if e["type"] == "rejected"]) == 1


async def test_a_refusal_before_the_candidate_is_known_is_not_remembered_for_the_last_one(
) -> None:
    store = RefusingStore()
    store.put(doc("a"))
    rec = make(store)
    await rec.converge_once()
    store.put(doc("a", "b"))
    # About revision 2, and retried every poll: not remembered.
    store.hydrate_error = ControlPlaneError("permission denied", category=FailureCategory.DENIED,
                                            revision=2)
    await rec.converge_once()
    store.hydrate_error = None
    # A final refusal of the pointer's read: this attempt has no candidate of its own.
    store.observe_error = ControlPlaneError("digest mismatch", category=FailureCategory.CORRUPT,
                                            revision=2)
    assert (await rec.converge_once()).reason == reasons.CORRUPT
    store.observe_error = None
    outcome = await rec.converge_once()
    assert (outcome.kind, outcome.revision) == (OutcomeKind.PUBLISHED, 2)


ENDED_LINE = "revision refusal recovered"


async def test_a_restart_mid_refusal_streak_tells_the_refusal_anew_and_its_end_once(
        autojump_clock: trio.testing.MockClock) -> None:
    store = FakeStore()
    store.put(doc("a"))
    first = make(store)
    await first.converge_once()
    bad = store.put(doc("a", keys={"k": ["nope"]}))
    with structlog.testing.capture_logs() as logs:
        await first.converge_once()
        await trio.sleep(5)
        assert (await first.converge_once()).repeated
        # The child restarts (the status outlives it, the telling does not).
        restarted = make(store, status=first.status)
        await trio.sleep(5)
        outcome = await restarted.converge_once()
        assert outcome.revision == bad and not outcome.repeated
        await trio.sleep(5)
        assert (await restarted.converge_once()).repeated
        assert restarted.status.report().consecutive_failures == 4
        store.put(doc("a", "c"))
        assert (await restarted.converge_once()).kind is OutcomeKind.PUBLISHED
        assert (await restarted.converge_once()).kind is OutcomeKind.CONVERGED
    refused = [e for e in logs if e["event"] == REFUSED_LINE]
    assert [(e["revision"], e["consecutive_failures"]) for e in refused] == [(bad, 1), (bad, 3)]
    [ended] = [e for e in logs if e["event"] == ENDED_LINE]
    assert ended["attempts"] == 2 and ended["active"] == 3  # the restarted loop's streak
    assert restarted.status.report().consecutive_failures == 0


async def test_a_restart_mid_refusal_then_desired_back_at_what_serves_rewrites_the_sinks_once(
        ) -> None:
    store = FakeStore()
    good = store.put(doc("a"))
    first, cache = with_cache(store)
    await first.converge_once()
    store.put(doc("a", keys={"k": ["nope"]}))
    await first.converge_once()
    restarted = make(store, status=first.status, cache=cache)
    assert (await restarted.converge_once()).failed
    assert [r for r, _ in cache.exported] == [good]  # nothing serves that the sinks lack
    store.desired_id = good  # an operator's rollback to what serves
    with structlog.testing.capture_logs() as logs:
        assert (await restarted.converge_once()).kind is OutcomeKind.CONVERGED
        assert (await restarted.converge_once()).kind is OutcomeKind.CONVERGED
    # The restarted child cannot know its predecessor wrote them: once, not per poll.
    assert [r for r, _ in cache.exported] == [good, good]
    assert [e["event"] for e in logs].count(ENDED_LINE) == 1


async def test_a_new_epoch_mid_refusal_judges_the_revision_once_afresh_then_remembers_it(
        ) -> None:
    store = FakeStore()
    store.put(doc("a"))
    rec, cache = with_cache(store)
    await rec.converge_once()
    bad = store.put(doc("a", keys={"k": ["nope"]}))
    await rec.converge_once()
    assert (await rec.converge_once()).repeated
    store.identity = "fake:2"  # a restore that kept the refused revision desired
    store.calls.clear()
    with structlog.testing.capture_logs() as logs:
        outcome = await rec.converge_once()
        assert outcome.revision == bad and not outcome.repeated
        assert [what for what, _ in store.calls] == ["desired", "hydrate"]
        assert (await rec.converge_once()).repeated  # remembered again in this epoch
        assert [what for what, _ in store.calls].count("hydrate") == 1
        store.desired_id = 1  # the restored database desires what serves
        assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
        assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert len([e for e in logs if "identity changed" in e["event"]]) == 1
    # The same refusal within the minute: its streak goes on, told at its end once.
    assert [e["event"] for e in logs].count(REFUSED_LINE) == 0
    assert [e["event"] for e in logs].count(ENDED_LINE) == 1
    assert [r for r, _ in cache.exported] == [1, 1]  # the sinks re-written once for the epoch


async def test_sighup_right_after_a_restart_hydrates_the_refused_revision_once_and_tells_it_once(
        ) -> None:
    store = FakeStore()
    store.put(doc("a"))
    first = make(store)
    await first.converge_once()
    bad = store.put(doc("a", keys={"k": ["nope"]}))
    await first.converge_once()
    restarted = make(store, status=first.status)
    store.calls.clear()
    with structlog.testing.capture_logs() as logs:
        outcome = await restarted.converge_once("sighup")
        assert outcome.revision == bad and not outcome.repeated
        assert (await restarted.converge_once()).repeated
        assert (await restarted.converge_once("sighup")).revision == bad
    assert [what for what, _ in store.calls].count("hydrate") == 2  # each sighup, no poll
    refused = [e for e in logs if e["event"] == REFUSED_LINE]
    assert len(refused) == 2  # the restart's first, and the second sighup's
    assert restarted.state.snapshot is not None and restarted.state.snapshot.revision == 1
