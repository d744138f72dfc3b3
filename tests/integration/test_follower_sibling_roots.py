"""Sibling roots: two real roots on one control plane with one key, behind one address.

Each root signs its own statement of the same intent (one identity, one
sequence, one body, each its own ``issued_at``). A follower polling them
round-robin through a proxy stays converged: no refusal counted, no
"replayed statement", and the body is not downloaded again at every switch
(the conditional request naming the same sequence and digest answers 304).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path

import httpx
import trio

from tests.fakes.statements import statement_of
from tests.followers import capture, make_node, status_of, wait_active, wait_status
from tests.health import metric_sum
from tests.httpproxy import SwitchingProxy
from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, run_daemon


async def rejections(url: str) -> float:
    async with httpx.AsyncClient(base_url=url) as http:
        text = (await http.get("/metrics")).text
    return metric_sum(text, "supervisor_revision_rejections_total") or 0.0


async def test_a_follower_behind_two_sibling_roots_round_robin_stays_converged(
    tmp_path: Path
) -> None:
    database = f"sqlite:///{tmp_path}/cp.db"
    a = make_node(tmp_path, "a", database, [])
    b = make_node(tmp_path, "b", database, [], key_name="a")
    await acli("db", "migrate", "--config", str(a.config))
    await acli("publish", "--config", str(a.config), str(EXAMPLE))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            await stack.enter_async_context(run_daemon(a.config))
            first = statement_of(await capture(a, 1))
            # B's statement issued later than A's, for certain.
            await poll_until(lambda: datetime.now(UTC) > first.issued_at)
            await stack.enter_async_context(run_daemon(b.config))
            second = statement_of(await capture(b, 1))
            assert (first.root, first.sequence) == (second.root, second.sequence)
            assert first.issued_at < second.issued_at
            proxy = SwitchingProxy(a.url, b.url)
            proxy.round_robin = True
            await nursery.start(proxy.serve)
            follower = make_node(tmp_path, "f", proxy.url, [a.verify_key],
                                 control_plane="listen = false")
            await stack.enter_async_context(run_daemon(follower.config))
            await wait_active(follower, 1)
            before = await rejections(follower.url)
            await wait_status(follower, lambda _: proxy.answers.get(304, 0) >= 6)
            report = await status_of(follower)
            revision = report["revision"]
            assert revision["last_rejection"] is None and revision["last_error"] is None
            assert revision["consecutive_failures"] == 0
            assert revision["desired"] == revision["active"] == 1
            assert revision["lag_s"] == 0.0
            assert await rejections(follower.url) == before == 0
            # One body from each root at most: every other answer was a 304.
            assert proxy.answers.get(200, 0) <= 2, proxy.answers
            assert revision["statement"]["issued_at"].startswith(
                second.issued_at.isoformat()[:19])
            nursery.cancel_scope.cancel()
