"""Thread hand-offs: a limit per dependency, a deadline per call, a stuck thread counted."""

from __future__ import annotations

import threading

import pytest
import trio

from supervisor.bounds import THREAD_LIMITS, ThreadDeadline, in_thread, outliving, thread_limiter


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
    with trio.fail_after(10):
        for _ in range(stuck):
            with pytest.raises(ThreadDeadline):
                await in_thread(release.wait, dependency="database", deadline_s=0.01,
                                what="stuck")
        assert thread_limiter("database").available_tokens == 0
        # No token left for the database: its next call ends at its deadline ...
        with pytest.raises(ThreadDeadline):
            await in_thread(lambda: 1, dependency="database", deadline_s=0.05, what="next")
        # ... while the files, the reload and the credentials still get threads.
        for dependency in ("files", "reload", "kube"):
            assert await in_thread(lambda: 2, dependency=dependency, deadline_s=5,
                                   what="other") == 2
        release.set()
