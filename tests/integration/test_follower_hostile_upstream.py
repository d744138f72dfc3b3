"""What a hostile or broken upstream can send a follower, through a real follower process.

The upstream is :class:`tests.fakes.statements.HostileUpstream` replaying a
genuine statement captured from a real root. Each misbehaviour (a non-ASCII
``ETag``, a nested gzip bomb, an endless chunked 500, a body dripped a byte at
a time, a flood of stream hints) must leave the follower as it was: its
convergence child never restarted, its memory bounded, ``/healthz`` 200, the
active revision unchanged, and the refusal named with its reason. A slow drip
at boot must not hold back the fallback to the follower's own signed cache.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.fakes.statements import HostileUpstream
from tests.followers import (
    Node,
    capture,
    make_node,
    restarts,
    rss_mib,
    status_of,
    wait_active,
    wait_status,
)
from tests.proc import EXAMPLE, Daemon, acli, run_daemon

FETCH_TIMEOUT_S = 1.0


def failing_with(reason: str, text: str) -> Callable[[dict[str, Any]], bool]:
    def holds(report: dict[str, Any]) -> bool:
        error = report["revision"]["last_error"] or ""
        return bool(error.startswith(f"{reason}:") and text in error
                    and report["revision"]["consecutive_failures"] >= 2)
    return holds


async def unharmed(node: Node, daemon: Daemon, active: int) -> dict[str, Any]:
    report = await status_of(node)
    assert restarts(report) == 0, report["children"]
    assert report["revision"]["active"] == active
    assert rss_mib(daemon.process.pid) < 300
    async with httpx.AsyncClient(base_url=node.url) as http:
        health = await http.get("/healthz")
        assert health.status_code == 200, health.text
    return report


async def captured_statement(tmp_path: Path) -> tuple[Node, bytes]:
    root = make_node(tmp_path, "root", f"sqlite:///{tmp_path}/cp.db", [])
    await acli("db", "migrate", "--config", str(root.config))
    await acli("publish", "--config", str(root.config), str(EXAMPLE))
    async with run_daemon(root.config):
        return root, await capture(root, 1)


@pytest.mark.chaos  # over 10 s through the real process: run by CI's `pytest -m chaos`
async def test_hostile_answers_are_refused_by_name_and_harm_nothing(tmp_path: Path) -> None:
    with trio.fail_after(150):
        root, genuine = await captured_statement(tmp_path)
        hostile = HostileUpstream(genuine)
        async with trio.open_nursery() as nursery:
            await nursery.start(hostile.serve)
            follower = make_node(tmp_path, "f", hostile.url, [root.verify_key],
                                 control_plane=f"fetch_timeout_s = {FETCH_TIMEOUT_S}")
            async with run_daemon(follower.config) as daemon:
                await wait_active(follower, 1)
                await daemon.wait_log("following the upstream's stream for wake-ups")

                for mode, reason, text in (
                    ("etag", "invalid", "ETag"),
                    ("gzip_bomb", "corrupt", "Content-Encoding"),
                    ("endless_500", "unavailable", "answered 500"),
                    ("drip", "unavailable", "fetch_timeout_s"),
                ):
                    hostile.mode = mode
                    await wait_status(follower, failing_with(reason, text))
                    report = await unharmed(follower, daemon, 1)
                    if reason != "unavailable":
                        assert report["revision"]["last_rejection"]["reason"] == reason
                    hostile.mode = "genuine"
                    await wait_status(follower, lambda r: r["revision"]["last_error"] is None)

                # 200,000 hints: at most one fetch per hint_min_interval_s (0.1 s).
                before = hostile.requests
                start = trio.current_time()
                hostile.flood(200_000)
                async with httpx.AsyncClient(base_url=follower.url, timeout=5) as http:
                    for _ in range(5):
                        assert (await http.get("/healthz")).status_code == 200
                await hostile.flood_sent.wait()
                await unharmed(follower, daemon, 1)
                elapsed = trio.current_time() - start
                fetched = hostile.requests - before
                assert 1 <= fetched <= elapsed / 0.1 + 5, (fetched, elapsed)
            nursery.cancel_scope.cancel()


async def test_a_slow_drip_at_boot_falls_back_to_the_signed_cache_within_the_fetch_timeout(
    tmp_path: Path
) -> None:
    with trio.fail_after(90):
        root, genuine = await captured_statement(tmp_path)
        hostile = HostileUpstream(genuine)
        async with trio.open_nursery() as nursery:
            await nursery.start(hostile.serve)
            follower = make_node(tmp_path, "f", hostile.url, [root.verify_key],
                                 control_plane=f"fetch_timeout_s = {FETCH_TIMEOUT_S}\n"
                                 "listen = false")
            async with run_daemon(follower.config):
                await wait_active(follower, 1)  # its own cache now holds revision 1
            hostile.mode = "drip"
            async with run_daemon(follower.config) as daemon:
                start = trio.current_time()
                await daemon.wait_log("serving the last-known-good cache", revision=1)
                assert trio.current_time() - start < FETCH_TIMEOUT_S + 5
                async with httpx.AsyncClient(base_url=follower.url) as http:
                    assert (await http.get("/readyz")).status_code == 200
            nursery.cancel_scope.cancel()
