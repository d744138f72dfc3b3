"""One daemon per cache: a second daemon on the same ``[cache].path`` waits for the lock.

It waits up to 10 s (a previous instance still stopping), then exits 1 naming
the path and the holder's pid; a predecessor that stops within the wait hands
the cache over.
"""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from supervisor.sinks.lkg.files import LOCK_WAIT_S
from tests.followers import Node, make_node, wait_active
from tests.proc import EXAMPLE, acli, run_daemon


async def two_on_one_cache(tmp_path: Path) -> tuple[Node, Node]:
    first = make_node(tmp_path, "first", f"sqlite:///{tmp_path}/cp.db", [])
    second = make_node(tmp_path, "second", f"sqlite:///{tmp_path}/cp.db", [])
    # The second one's cache is the first one's file.
    second.config.write_text(second.config.read_text().replace(str(second.cache),
                                                               str(first.cache)))
    await acli("db", "migrate", "--config", str(first.config))
    await acli("publish", "--config", str(first.config), str(EXAMPLE))
    return first, second


async def test_a_second_daemon_waits_for_the_lock_then_exits_1_naming_the_path_and_pid(
    tmp_path: Path
) -> None:
    first, second = await two_on_one_cache(tmp_path)
    with trio.fail_after(90):
        async with run_daemon(first.config) as holder:
            await wait_active(first, 1)
            start = trio.current_time()
            async with run_daemon(second.config) as other:
                assert await other.wait() == 1
            assert trio.current_time() - start >= LOCK_WAIT_S
            text = "\n".join(other.raw)
            assert str(first.cache) in text and "another daemon" in text
            assert f"pid {holder.process.pid}" in text
            await wait_active(first, 1)  # the first one undisturbed


async def test_a_predecessor_still_stopping_hands_the_cache_over(tmp_path: Path) -> None:
    first, second = await two_on_one_cache(tmp_path)
    with trio.fail_after(90):
        async with run_daemon(first.config) as holder:
            await wait_active(first, 1)
            async with run_daemon(second.config) as successor:
                await trio.sleep(1.0)  # the successor is waiting for the lock now
                holder.signal(signal.SIGTERM)
                assert await holder.wait() == 0
                await wait_active(second, 1)
                assert successor.process.returncode is None
