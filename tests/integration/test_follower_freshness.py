"""A frozen root shows on every follower: statements expire, followers say ``stale``, keep serving.

A root re-signs its statement only after a successful read of its control
plane; with a 6 s ``[cache].statement_ttl_s`` and its SQLite file moved
away (an outage), it keeps serving its last statement, unrefreshed. Its
followers (two hops) receive 304s for a statement whose ``expires_at``
passes: within the TTL plus three polls both report ``stale`` (in
``last_rejection`` and ``revision.statement.stale``), a statement age
(``revision.statement_age_s``) that grows from the root's ``issued_at`` while
their lag stays 0 (they serve what the root desires), and keep serving. The file moved back, the root
signs again and the staleness clears down the tree.
"""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.followers import POLL_S, capture, make_node, wait_active, wait_status
from tests.proc import EXAMPLE, acli, run_daemon

TTL_S = 6.0


def stale(report: dict[str, Any]) -> bool:
    revision = report["revision"]
    rejection = revision["last_rejection"] or {}
    return bool(rejection.get("reason") == "stale" and revision["statement"]["stale"]
                and revision["last_error"] is not None)


def fresh(report: dict[str, Any]) -> bool:
    revision = report["revision"]
    return bool(not revision["statement"]["stale"] and revision["last_error"] is None)


@pytest.mark.chaos  # over 10 s through the real process: run by CI's `pytest -m chaos`
async def test_followers_report_stale_within_the_ttl_and_recover_with_the_root(
    tmp_path: Path
) -> None:
    database = tmp_path / "cp.db"
    root = make_node(tmp_path, "root", f"sqlite:///{database}", [],
                     cache=f"statement_ttl_s = {TTL_S}")
    f1 = make_node(tmp_path, "f1", root.url, [root.verify_key], control_plane="listen = false")
    f2 = make_node(tmp_path, "f2", f1.url, [root.verify_key], control_plane="listen = false")
    await acli("db", "migrate", "--config", str(root.config))
    await acli("publish", "--config", str(root.config), str(EXAMPLE))
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            up = await stack.enter_async_context(run_daemon(root.config))
            await capture(root, 1)
            for node in (f1, f2):
                await stack.enter_async_context(run_daemon(node.config))
                await wait_active(node, 1)
            # The root re-signs while it can read its control plane: past one TTL, still fresh.
            await up.wait_log("published", revision=1)
            first = (await wait_status(f2, fresh))["revision"]["statement"]
            await wait_status(f2, lambda r: r["revision"]["statement"]["issued_at"]
                              != first["issued_at"])

            os.replace(database, tmp_path / "away.db")
            start = trio.current_time()
            for node in (f1, f2):
                report = await wait_status(node, stale)
                assert report["revision"]["active"] == 1
                assert report["revision"]["statement_age_s"] >= TTL_S
                assert report["revision"]["lag_s"] == 0.0
            assert trio.current_time() - start < TTL_S + 3 * POLL_S + 2.0
            # Still serving their own followers (and snapshot) meanwhile.
            report = await wait_status(f2, stale)
            assert report["revision"]["source"] == f1.url
            async with httpx.AsyncClient(base_url=f2.url) as http:
                assert (await http.get("/v1/snapshot")).json()["revision"] == 1
                assert (await http.get("/healthz")).status_code == 200

            os.replace(tmp_path / "away.db", database)
            for node in (f1, f2):
                report = await wait_status(node, fresh)
                assert report["revision"]["statement_age_s"] < TTL_S
