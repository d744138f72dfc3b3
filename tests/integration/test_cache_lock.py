"""One daemon per cache: a second daemon given the same ``[cache].path`` exits 2 naming it."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.followers import make_node, wait_active
from tests.proc import EXAMPLE, acli, run_daemon


async def test_a_second_daemon_on_the_same_cache_path_exits_2_naming_it(tmp_path: Path) -> None:
    first = make_node(tmp_path, "first", f"sqlite:///{tmp_path}/cp.db", [])
    second = make_node(tmp_path, "second", f"sqlite:///{tmp_path}/cp.db", [])
    # The second one's cache is the first one's file.
    second.config.write_text(second.config.read_text().replace(str(second.cache),
                                                               str(first.cache)))
    await acli("db", "migrate", "--config", str(first.config))
    await acli("publish", "--config", str(first.config), str(EXAMPLE))
    with trio.fail_after(60):
        async with run_daemon(first.config):
            await wait_active(first, 1)
            async with run_daemon(second.config) as other:
                assert await other.wait() == 2
            text = "\n".join(other.raw)
            assert str(first.cache) in text and "another daemon" in text
            await wait_active(first, 1)  # the first one undisturbed
        # Once the first has exited, the lock is free.
        async with run_daemon(second.config):
            await wait_active(second, 1)
