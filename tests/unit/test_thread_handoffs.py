"""Thread hand-offs: a limit per dependency, a deadline per call, a stuck thread counted."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from supervisor.threads import (
    FILE_IO_DEADLINE_S,
    THREAD_LIMITS,
    ThreadDeadline,
    _Handoff,
    in_thread,
    outliving,
    thread_limiter,
)
from tests.polling import poll_until


def _none_added(before: dict[str, int]) -> bool:
    """No dependency has more outliving threads than ``before``: another test's abandoned
    thread may return meanwhile (fewer), but the call under test may not leave one."""
    now = outliving()
    return all(now.get(dep, 0) <= before.get(dep, 0) for dep in now)


async def test_a_call_past_its_deadline_raises_and_its_thread_is_counted_until_it_returns() -> None:
    release = threading.Event()
    before = outliving().get("database", 0)  # the process's other tests may leave some
    with trio.fail_after(10):
        with pytest.raises(ThreadDeadline, match=r"stuck read timed out after 0\.05 s"):
            await in_thread(release.wait, dependency="database", deadline_s=0.05,
                            what="stuck read")
        assert outliving()["database"] == before + 1
        release.set()
        while outliving().get("database", 0) > before:
            await trio.sleep(0.01)


async def test_a_stuck_dependency_exhausts_only_its_own_limit() -> None:
    release = threading.Event()
    stuck = THREAD_LIMITS["database"]
    started: list[int] = []

    def hang() -> None:
        started.append(1)
        release.wait()

    async def one() -> None:
        with pytest.raises(ThreadDeadline):
            await in_thread(hang, dependency="database", deadline_s=2, what="stuck")

    with trio.fail_after(20):
        # All at once, each given up only after every thread started (a call given up
        # before its thread starts never runs, and gives its token back).
        async with trio.open_nursery() as nursery:
            for _ in range(stuck):
                nursery.start_soon(one)
        assert len(started) == stuck
        assert thread_limiter("database").available_tokens == 0
        # No token left for the database: its next call ends at its deadline ...
        with pytest.raises(ThreadDeadline):
            await in_thread(lambda: 1, dependency="database", deadline_s=0.05, what="next")
        # ... while the files, the reload and the credentials still get threads.
        for dependency in ("files", "reload", "kube"):
            assert await in_thread(lambda: 2, dependency=dependency, deadline_s=5,
                                   what="other") == 2
        release.set()


async def test_a_deadline_of_zero_never_starts_the_call() -> None:
    ran = threading.Event()
    before = outliving()
    with trio.fail_after(10):
        with pytest.raises(ThreadDeadline, match="timed out after 0 s"):
            await in_thread(ran.set, dependency="files", deadline_s=0, what="instant")
        assert await in_thread(lambda: 3, dependency="files", deadline_s=5, what="next") == 3
    assert not ran.is_set() and _none_added(before)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
async def test_a_base_exception_in_the_thread_reaches_the_caller_and_frees_its_token(
        exc: type[BaseException]) -> None:
    def fail() -> None:
        raise exc

    before = outliving()
    with trio.fail_after(10):
        with pytest.raises(exc):
            await in_thread(fail, dependency="reload", deadline_s=5, what="failing")
    assert thread_limiter("reload").available_tokens == THREAD_LIMITS["reload"]
    assert _none_added(before)


async def test_a_call_cancelled_while_waiting_for_a_token_never_runs() -> None:
    release, ran = threading.Event(), threading.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(THREAD_LIMITS["kube"]):
                nursery.start_soon(lambda: in_thread(release.wait, dependency="kube",
                                                     deadline_s=10, what="holder"))
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(0.05):
                await in_thread(ran.set, dependency="kube", deadline_s=10, what="waiter")
            assert outliving().get("kube", 0) == 0
            release.set()
        assert await in_thread(lambda: 4, dependency="kube", deadline_s=5, what="after") == 4
    assert not ran.is_set()


def test_the_dependency_names_are_the_limits_keys_so_a_typo_fails_the_type_check() -> None:
    """A name not in THREAD_LIMITS would raise KeyError at its first call, perhaps at
    3 a.m.: the parameter's type is the keys, so mypy refuses it before it ships."""
    from typing import get_args, get_type_hints

    from supervisor import threads

    assert set(get_args(threads.Dependency)) == set(THREAD_LIMITS)
    for fn in (in_thread, thread_limiter):
        assert get_type_hints(fn)["dependency"] == threads.Dependency


async def test_a_stuck_call_is_logged_when_given_up_and_again_when_it_returns() -> None:
    release = threading.Event()
    with trio.fail_after(10), capture_logs() as logs:
        with pytest.raises(ThreadDeadline) as info:
            await in_thread(release.wait, dependency="files", deadline_s=0.05, what="slow disk")
        assert (info.value.what, info.value.deadline_s) == ("slow disk", 0.05)
        release.set()
        await poll_until(lambda: any(
            e["event"] == "worker thread returned after its caller gave up" for e in logs))
    gave_up, returned = (e for e in logs if e["event"].startswith("worker thread"))
    assert gave_up["event"] == "worker thread still running after its caller gave up"
    assert (gave_up["dependency"], gave_up["what"]) == ("files", "slow disk")
    assert (returned["dependency"], returned["what"]) == ("files", "slow disk")
    assert returned["late_s"] >= 0


def test_a_hand_off_given_up_before_its_thread_starts_never_runs_its_call() -> None:
    # The race between taking a token and starting: the caller gave up in between.
    ran = threading.Event()
    before = outliving()
    handoff = _Handoff(ran.set, "cpu", "late start")
    handoff.abandon()
    with pytest.raises(ThreadDeadline, match="late start timed out after 0 s"):
        handoff.run()
    assert not ran.is_set() and _none_added(before)


def test_a_hand_off_given_up_after_its_call_returned_is_not_counted() -> None:
    # The caller cancelled while the result was on its way back: no thread is left.
    before = outliving()
    handoff = _Handoff(lambda: 5, "cpu", "quick")
    assert handoff.run() == 5
    handoff.abandon()
    assert _none_added(before)


def test_the_limits_and_the_file_deadline_are_those_the_operations_guide_states() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    limits = ", ".join(f"{dep} {n}" for dep, n in THREAD_LIMITS.items())
    assert f"(`THREAD_LIMITS`: {limits})" in " ".join(guide.split())
    assert f"a write or read past {FILE_IO_DEADLINE_S:g} s is a failed" in " ".join(guide.split())
