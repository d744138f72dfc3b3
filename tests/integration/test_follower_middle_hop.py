"""A middle hop that refuses a newer revision keeps serving its active statement below it.

The root publishes revision 2 whose key reads a secret from an environment
variable the middle follower lacks: the middle hop accepts the statement,
refuses to compile it (``secret``) and keeps serving revision 1, and its
``GET /v1/revision`` keeps answering 200 with the root's signed bytes of
revision 1 (what it serves, not what it received), also after a restart of
its convergence child. A follower started cold under it boots on revision 1.
"""

from __future__ import annotations

import signal
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from tests.fakes.statements import statement_of
from tests.followers import (
    capture,
    document,
    make_node,
    restarts,
    revision_bytes,
    wait_active,
    wait_status,
)
from tests.proc import EXAMPLE, acli, run_daemon

SECRET_ENV = "FOLLOWER_TEST_ONLY_AT_THE_ROOT"


async def test_a_middle_hop_refusing_a_newer_revision_serves_its_active_one_to_a_cold_follower(
    tmp_path: Path
) -> None:
    root = make_node(tmp_path, "root", f"sqlite:///{tmp_path}/cp.db", [])
    middle = make_node(tmp_path, "middle", root.url, [root.verify_key],
                       control_plane="listen = false")
    cold = make_node(tmp_path, "cold", middle.url, [root.verify_key],
                     control_plane="listen = false")
    needs_secret = document(tmp_path, 5, extra=(
        f'\n[keys.rooted]\nsecret = "env:{SECRET_ENV}"\naliases = ["chat"]\n'))
    faults = tmp_path / "faults"
    faults.mkdir()
    await acli("db", "migrate", "--config", str(root.config))
    await acli("publish", "--config", str(root.config), str(EXAMPLE))
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(
                run_daemon(root.config, env={SECRET_ENV: "only-here"}))
            first = await capture(root, 1)
            mid = await stack.enter_async_context(
                run_daemon(middle.config, env={"SUPERVISOR_TEST_FAULT_DIR": str(faults)}))
            await wait_active(middle, 1)

            await acli("publish", "--config", str(root.config), str(needs_secret))
            await capture(root, 2)

            def refused_the_secret(report: dict) -> bool:  # type: ignore[type-arg]
                rejection = report["revision"]["last_rejection"] or {}
                return bool(rejection.get("reason") == "secret")

            report = await wait_status(middle, refused_the_secret)
            assert report["revision"]["active"] == 1
            assert await revision_bytes(middle) == (200, first)

            (faults / "crash-convergence").touch()
            mid.signal(signal.SIGUSR2)
            await wait_status(middle, lambda r: restarts(r) == 1 and refused_the_secret(r))
            code, data = await revision_bytes(middle)
            assert code == 200 and statement_of(data).revision == 1

            below = await stack.enter_async_context(run_daemon(cold.config))
            await below.wait_log("published", revision=1)
            report = await wait_active(cold, 1)
            assert report["revision"]["sequence"] == 1
