"""A follower is pinned to its root: another root signing with the same key is denied.

Two real roots share one signing key: A, which published revisions 1 and 2 and
was rolled back to 1 (sequence 3), and B, a copy of A's SQLite database taken
before the rollback (a DR drill, a staging clone: active 2, sequence 2). A
proxy in front of the follower switches from A to B. The follower must stay at
revision 1 (sequence 3), refusing B as ``denied`` naming both identities, also
after a restart; ``follower reset`` (without a restart) lets it take B, which
then pins B.
"""

from __future__ import annotations

import json
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from tests.fakes.statements import statement_of
from tests.followers import capture, document, make_node, status_of, wait_active, wait_status
from tests.httpproxy import SwitchingProxy
from tests.proc import acli, run_daemon


def denied_naming(*identities: str) -> Any:
    def holds(report: dict[str, Any]) -> bool:
        rejection = report["revision"]["last_rejection"] or {}
        return bool(rejection.get("reason") == "denied"
                    and all(repr(i) in rejection["detail"] for i in identities))
    return holds


async def test_a_restored_copy_of_the_root_cannot_move_the_follower_until_it_is_reset(
    tmp_path: Path
) -> None:
    a = make_node(tmp_path, "a", f"sqlite:///{tmp_path}/a.db", [])
    b = make_node(tmp_path, "b", f"sqlite:///{tmp_path}/b.db", [], key_name="a")
    await acli("db", "migrate", "--config", str(a.config))
    for retries in (1, 2):
        await acli("publish", "--config", str(a.config), str(document(tmp_path, retries)))
    (tmp_path / "b.db").write_bytes((tmp_path / "a.db").read_bytes())  # before the rollback
    await acli("rollback", "--config", str(a.config), "1")
    with trio.fail_after(150):
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            await stack.enter_async_context(run_daemon(a.config))
            await stack.enter_async_context(run_daemon(b.config))
            root_a = statement_of(await capture(a, 1)).root
            root_b = statement_of(await capture(b, 2)).root
            assert root_a != root_b
            proxy = SwitchingProxy(a.url, b.url)
            await nursery.start(proxy.serve)
            follower = make_node(tmp_path, "f", proxy.url, [a.verify_key],
                                 control_plane="listen = false")
            accepted = Path(str(follower.cache) + ".accepted")
            f = await stack.enter_async_context(run_daemon(follower.config))
            report = await wait_active(follower, 1)
            assert report["revision"]["sequence"] == 3

            proxy.index = 1  # root B in front of the follower
            report = await wait_status(follower, denied_naming(root_b, root_a))
            assert "follower reset" in report["revision"]["last_rejection"]["detail"]
            report = await wait_status(
                follower, lambda r: r["revision"]["consecutive_failures"] >= 3)
            assert (report["revision"]["active"], report["revision"]["sequence"]) == (1, 3)
            assert json.loads(accepted.read_text())["root"] == root_a

            f.signal(signal.SIGTERM)  # a restart does not forget the pinned root
            assert await f.wait() == 0
            await stack.enter_async_context(run_daemon(follower.config))
            report = await wait_status(follower, lambda r: denied_naming(root_b, root_a)(r)
                                       and r["revision"]["active"] == 1)
            assert report["revision"]["sequence"] == 3

            # Without --yes and without a terminal: exit 2, nothing forgotten.
            refused = await acli("follower", "reset", "--config", str(follower.config),
                                 check=False)
            assert refused.returncode == 2 and "--yes" in refused.stderr
            assert json.loads(accepted.read_text())["root"] == root_a
            done = await acli("follower", "reset", "--config", str(follower.config), "--yes")
            assert "sequence 3" in done.stdout and root_a in done.stdout
            report = await wait_active(follower, 2)  # the running follower takes B
            assert report["revision"]["sequence"] == 2
            assert json.loads(accepted.read_text())["root"] == root_b
            proxy.index = 0  # A is now the other root
            await wait_status(follower, denied_naming(root_a, root_b))
            assert (await status_of(follower))["revision"]["active"] == 2
            nursery.cancel_scope.cancel()
