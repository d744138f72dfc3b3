"""The fleet view over real replicas: a root, two followers, one follower of a follower.

Each follower names itself on its fetches; ``GET /v1/followers`` lists a replica's
direct followers; ``status --fleet`` walks the tree from the root, and ``publish
--wait --fleet`` waits for every replica it finds. One replica is then killed: the
walk shows it unreachable (its parent still lists it) and exits 1.
"""

from __future__ import annotations

import json
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.followers import Node, document, make_node, wait_active
from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, run_daemon


async def listed(node: Node) -> dict[str, dict[str, Any]]:
    async with httpx.AsyncClient(base_url=node.url) as http:
        rows = (await http.get("/v1/followers")).json()["followers"]
    return {row["url"]: row for row in rows}


async def test_the_fleet_view_walks_a_tree_of_four_with_one_stopped(tmp_path: Path) -> None:
    root = make_node(tmp_path, "root", f"sqlite:///{tmp_path}/cp.db", [])
    f1 = make_node(tmp_path, "f1", root.url, [root.verify_key])
    # A long poll: listed for 30 s after it is stopped.
    f2 = make_node(tmp_path, "f2", root.url, [root.verify_key], poll_interval_s=10)
    f3 = make_node(tmp_path, "f3", f1.url, [root.verify_key])
    await acli("db", "migrate", "--config", str(root.config))
    await acli("publish", "--config", str(root.config), str(EXAMPLE))
    with trio.fail_after(240):
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(run_daemon(root.config))
            await stack.enter_async_context(run_daemon(f1.config))
            stopped = await stack.enter_async_context(run_daemon(f2.config))
            await wait_active(f1, 1)  # a follower without a cache boots only from a server
            await stack.enter_async_context(run_daemon(f3.config))
            for node in (f2, f3):
                await wait_active(node, 1)

            async def whole() -> bool:
                return set(await listed(root)) == {f1.url, f2.url} and \
                    set(await listed(f1)) == {f3.url}

            await poll_until(whole)
            row = (await listed(root))[f1.url]
            assert row["state"] == "converged" and row["sequence"] == 1
            assert row["etag"].startswith('"1.') and row["reason"] is None
            async with httpx.AsyncClient(base_url=root.url) as http:
                metrics = (await http.get("/metrics")).text
            assert 'supervisor_followers{state="converged"} 2.0' in metrics

            walked = await acli("status", "--fleet", "--json", "--url", root.url,
                                "--config", str(root.config), check=False)
            assert walked.returncode == 0, walked.stdout + walked.stderr
            rows = json.loads(walked.stdout)["replicas"]
            shape = [(r["depth"], r["url"], r["state"], r["sequence"]) for r in rows]
            assert shape[0] == (0, root.url, "converged", 1)
            assert shape[shape.index((1, f1.url, "converged", 1)) + 1] == \
                (2, f3.url, "converged", 1)
            assert (1, f2.url, "converged", 1) in shape and len(shape) == 4
            table = await acli("status", "--fleet", "--url", root.url, check=False)
            assert table.returncode == 0 and "None" not in table.stdout
            assert f"    {f3.url}" in table.stdout  # indented by its depth

            second = document(tmp_path, 7)
            waited = await acli("publish", "--config", str(root.config), str(second),
                                "--wait", "--fleet", "--url", root.url, "--json",
                                "--timeout", "60", check=False)
            assert waited.returncode == 0, waited.stdout + waited.stderr
            verdicts = json.loads(waited.stdout)["replicas"]
            assert sorted(v["url"] for v in verdicts) == sorted(
                n.url for n in (root, f1, f2, f3))
            assert {v["state"] for v in verdicts} == {"active"}

            stopped.signal(signal.SIGKILL)
            await stopped.wait()
            walked = await acli("status", "--fleet", "--json", "--url", root.url, check=False)
            assert walked.returncode == 1
            rows = json.loads(walked.stdout)["replicas"]
            dead = next(r for r in rows if r["url"] == f2.url)
            assert dead["state"] == "unreachable" and dead["reason"] == "unavailable"
            assert dead["detail"]
            assert {r["state"] for r in rows if r["url"] != f2.url} == {"converged"}
