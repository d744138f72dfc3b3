"""A statement's times, signed by the root's key but out of range, served to a real follower.

The follower must refuse the statement as ``corrupt`` (its times convert to
UTC inside years 2000..9998, its window at most 30 days) and keep serving what
it has, with its convergence child never restarted; restarted against the same
upstream, it boots its own signed cache and refuses the statement again.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.sinks.lkg import format_verify_key
from tests.fakes.statements import HostileUpstream, Root
from tests.followers import make_node, restarts, wait_active, wait_status
from tests.proc import run_daemon


def refused_corrupt(text: str) -> Any:
    def holds(report: dict[str, Any]) -> bool:
        rejection = report["revision"]["last_rejection"] or {}
        return bool(rejection.get("reason") == "corrupt" and text in rejection["detail"])
    return holds


@pytest.mark.parametrize(("fields", "text"), [
    ({"expires_at": "9999-12-31T23:59:59-23:59"}, "expires_at"),
    ({"issued_at": "0001-01-01T00:00:00+01:00"}, "issued_at"),
    ({"issued_at": "2000-01-01T00:00:00Z", "expires_at": "9998-12-31T00:00:00Z"}, "30 days"),
])
async def test_a_signed_statement_with_times_out_of_range_is_corrupt_and_serving_goes_on(
    tmp_path: Path, fields: dict[str, str], text: str
) -> None:
    root = Root()
    good = root.sign(1, sequence=1)
    hostile = HostileUpstream(good)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await nursery.start(hostile.serve)
            follower = make_node(tmp_path, "f", hostile.url,
                                 [format_verify_key(root.key.verify_key)],
                                 control_plane="listen = false")
            async with run_daemon(follower.config) as daemon:
                await wait_active(follower, 1)
                hostile.data = root.sign_fields(2, 2, **fields)
                report = await wait_status(follower, refused_corrupt(text))
                assert report["revision"]["active"] == 1
                report = await wait_status(
                    follower, lambda r: r["revision"]["consecutive_failures"] >= 3)
                assert restarts(report) == 0 and report["revision"]["active"] == 1
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0
            async with run_daemon(follower.config):
                report = await wait_status(follower, lambda r: refused_corrupt(text)(r)
                                           and r["revision"]["active"] == 1)
                assert report["revision"]["source"] == "last_known_good"
                assert restarts(report) == 0
            nursery.cancel_scope.cancel()

