"""The accepted file is written again at every poll until a write succeeds, a 304 included.

A real follower process is given a file-size limit (``RLIMIT_FSIZE`` set on it
with ``prlimit``: a write past it fails with ``EFBIG``, as on a full disk)
while its root publishes sequence 2: it serves 2, its ``.accepted`` still says
1. The limit lifted, the next poll (a 304: nothing changed upstream) writes 2;
after a restart, a replay of sequence 1 is refused as ``rollback``.
"""

from __future__ import annotations

import json
import resource
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from tests.fakes.statements import HostileUpstream
from tests.followers import capture, make_node, wait_active, wait_status
from tests.httpproxy import SwitchingProxy
from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, run_daemon


def accepted_sequence(path: Path) -> int:
    return int(json.loads(path.read_text())["sequence"])


async def test_a_full_disk_keeps_the_accepted_file_behind_until_the_next_poll_writes_it(
    tmp_path: Path
) -> None:
    root = make_node(tmp_path, "root", f"sqlite:///{tmp_path}/cp.db", [])
    await acli("db", "migrate", "--config", str(root.config))
    await acli("publish", "--config", str(root.config), str(EXAMPLE))
    with trio.fail_after(150):
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            await stack.enter_async_context(run_daemon(root.config))
            first = await capture(root, 1)
            replay = HostileUpstream(first)
            await nursery.start(replay.serve)
            proxy = SwitchingProxy(root.url, replay.url)
            await nursery.start(proxy.serve)
            follower = make_node(tmp_path, "f", proxy.url, [root.verify_key],
                                 control_plane="listen = false")
            accepted = Path(str(follower.cache) + ".accepted")
            f = await stack.enter_async_context(run_daemon(follower.config))
            await wait_active(follower, 1)
            assert accepted_sequence(accepted) == 1

            pid = f.process.pid
            # A soft limit: every write past 64 bytes fails; lifted again below.
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))
            await acli("publish", "--config", str(root.config), "--force", str(EXAMPLE))
            report = await wait_active(follower, 2)
            assert report["revision"]["sequence"] == 2
            await wait_status(follower, lambda r: r["revision"]["generation"] >= 1
                              and r["sinks"]["cache"] != "ok")
            assert accepted_sequence(accepted) == 1

            before, full = proxy.answers.get(304, 0), proxy.answers.get(200, 0)
            resource.prlimit(pid, resource.RLIMIT_FSIZE,
                             (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

            async def written() -> bool:
                return accepted_sequence(accepted) == 2

            await poll_until(written)
            await poll_until(lambda: proxy.answers.get(304, 0) > before)
            assert proxy.answers.get(200, 0) == full  # written on a 304 poll: no 200 since

            f.signal(signal.SIGTERM)
            assert await f.wait() == 0
            proxy.index = 1  # a replay of sequence 1
            await stack.enter_async_context(run_daemon(follower.config))

            def refused(report: dict[str, Any]) -> bool:
                rejection = report["revision"]["last_rejection"] or {}
                return bool(rejection.get("reason") == "rollback"
                            and report["revision"]["active"] == 2)

            await wait_status(follower, refused)
            assert accepted_sequence(accepted) == 2
            nursery.cancel_scope.cancel()
