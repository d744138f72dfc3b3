"""A follower never goes back: replays refused across child crashes and restarts, through real processes.

The root is a real replica on SQLite; its genuine signed statements are
captured from its ``GET /v1/revision`` and replayed by a hostile upstream
(:class:`tests.fakes.statements.HostileUpstream`) that a follower, and a
follower of that follower, poll. The follower's highest accepted statement is
kept beside its cache (``lkg.bin.accepted``) and by the daemon across child
restarts, so a replay of an older statement is ``rollback`` after a crash of
the convergence child and after a restart of the whole process; its served
mark is never lowered and nothing older is passed on downstream. An operator's
rollback at the root, by contrast, is a higher sequence: it reaches every hop
within a poll or so each, without a restart.
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from tests.fakes.statements import HostileUpstream, statement_of
from tests.followers import (
    POLL_S,
    capture,
    document,
    make_node,
    restarts,
    revision_bytes,
    status_of,
    wait_active,
    wait_status,
)
from tests.proc import EXAMPLE, acli, run_daemon


def rejected(reason: str):  # type: ignore[no-untyped-def]
    def holds(report: dict) -> bool:  # type: ignore[type-arg]
        rejection = report["revision"]["last_rejection"] or {}
        return bool(rejection.get("reason") == reason)
    return holds


async def test_a_replay_is_refused_after_a_child_crash_and_a_restart_and_never_passed_on(
    tmp_path: Path
) -> None:
    root = make_node(tmp_path, "root", f"sqlite:///{tmp_path}/cp.db", [])
    await acli("db", "migrate", "--config", str(root.config))
    # Published before the root starts: a root with nothing desired refuses to boot.
    await acli("publish", "--config", str(root.config), str(EXAMPLE))
    with trio.fail_after(120):
        async with run_daemon(root.config) as up:
            await up.wait_log("published", revision=1)
            first = await capture(root, 1)
            for _ in (2, 3):
                await acli("publish", "--config", str(root.config), "--force", str(EXAMPLE))
            third = await capture(root, 3)
        assert (statement_of(first).sequence, statement_of(third).sequence) == (1, 3)

        hostile = HostileUpstream(third)
        faults = tmp_path / "faults"
        faults.mkdir()
        env = {"SUPERVISOR_TEST_FAULT_DIR": str(faults)}
        async with trio.open_nursery() as nursery:
            await nursery.start(hostile.serve)
            follower = make_node(tmp_path, "f", hostile.url, [root.verify_key],
                                 control_plane="listen = false")
            below = make_node(tmp_path, "ff", follower.url, [root.verify_key],
                              control_plane="listen = false")
            mark = Path(str(follower.cache) + ".served")
            async with AsyncExitStack() as stack:
                f = await stack.enter_async_context(run_daemon(follower.config, env=env))
                await wait_active(follower, 3)
                await stack.enter_async_context(run_daemon(below.config))
                await wait_active(below, 3)

                # The hub replays revision 1's genuine statement; the convergence child crashes.
                hostile.data = first
                (faults / "crash-convergence").touch()
                f.signal(signal.SIGUSR2)
                report = await wait_status(follower, lambda r: restarts(r) == 1
                                           and rejected("rollback")(r))
                assert report["revision"]["active"] == 3
                assert "sequence 1" in report["revision"]["last_rejection"]["detail"]
                assert mark.read_text().strip() == "3"
                assert await revision_bytes(follower) == (200, third)
                # Three more polls of the follower below: it still has revision 3 only.
                polled = (await status_of(below))["revision"]["generation"]
                await wait_status(follower, lambda r: r["revision"]["consecutive_failures"] >= 3)
                report = await status_of(below)
                assert report["revision"]["active"] == 3
                assert report["revision"]["generation"] == polled

                # The whole process restarts against the replay: it boots its own cache.
                f.signal(signal.SIGTERM)
                assert await f.wait() == 0
                await stack.enter_async_context(run_daemon(follower.config, env=env))
                # The first refusal may show before the cache has booted: wait for both.
                report = await wait_status(follower, lambda r: rejected("rollback")(r)
                                           and r["revision"]["active"] == 3)
                assert report["revision"]["source"] == "last_known_good"
                assert report["revision"]["sequence"] == 3
                assert mark.read_text().strip() == "3"
                accepted = json.loads(Path(str(follower.cache) + ".accepted").read_text())
                assert (accepted["sequence"], accepted["revision"]) == (3, 3)
                assert await revision_bytes(follower) == (200, third)
                assert (await status_of(below))["revision"]["active"] == 3
            nursery.cancel_scope.cancel()


async def test_an_operator_rollback_reaches_both_hops_within_a_poll_each_without_restarts(
    tmp_path: Path
) -> None:
    root = make_node(tmp_path, "root", f"sqlite:///{tmp_path}/cp.db", [])
    f1 = make_node(tmp_path, "f1", root.url, [root.verify_key], control_plane="listen = false")
    f2 = make_node(tmp_path, "f2", f1.url, [root.verify_key], control_plane="listen = false")
    await acli("db", "migrate", "--config", str(root.config))
    for _ in (1, 2, 3):
        await acli("publish", "--config", str(root.config), "--force", str(EXAMPLE))
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(run_daemon(root.config))
            await capture(root, 3)
            for node in (f1, f2):
                await stack.enter_async_context(run_daemon(node.config))
                await wait_active(node, 3)
            await acli("rollback", "--config", str(root.config), "2")
            start = trio.current_time()
            for node in (f1, f2):
                report = await wait_active(node, 2)
                assert report["revision"]["sequence"] == 4  # the root's intent, not the id
                assert report["revision"]["last_rejection"] is None
                assert restarts(report) == 0
            # Two hops, a poll each, plus the root's own poll and the compile.
            assert trio.current_time() - start < 3 * POLL_S + 3.0
            assert (await status_of(root))["revision"]["sequence"] == 4


async def test_a_restored_root_reusing_an_id_for_another_body_reaches_its_followers_on_reset(
    tmp_path: Path
) -> None:
    """The root's SQLite file restored from a backup; id 3 then names another body.

    The restored file is another root identity: denied until ``follower reset``.
    """
    database = tmp_path / "cp.db"
    root = make_node(tmp_path, "root", f"sqlite:///{database}", [])
    follower = make_node(tmp_path, "f", root.url, [root.verify_key],
                         control_plane="listen = false")
    await acli("db", "migrate", "--config", str(root.config))
    for retries in (1, 2):
        await acli("publish", "--config", str(root.config), str(document(tmp_path, retries)))
    backup = tmp_path / "backup.db"
    backup.write_bytes(database.read_bytes())
    await acli("publish", "--config", str(root.config), str(document(tmp_path, 3)))
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            up = await stack.enter_async_context(run_daemon(root.config))
            before = statement_of(await capture(root, 3))
            await stack.enter_async_context(run_daemon(follower.config))
            await wait_active(follower, 3)
            up.signal(signal.SIGTERM)
            assert await up.wait() == 0
            # Restore (a new file: another identity), and a new document takes id 3 again.
            restored = tmp_path / "restored.db"
            restored.write_bytes(backup.read_bytes())
            os.replace(restored, database)
            await acli("publish", "--config", str(root.config), str(document(tmp_path, 4)))
            await stack.enter_async_context(run_daemon(root.config))
            after = statement_of(await capture(root, 3))
            assert after.body_sha256 != before.body_sha256 and after.root != before.root
            assert after.sequence <= before.sequence  # the restored count is behind

            await wait_status(follower, rejected("denied"))
            await acli("follower", "reset", "--config", str(follower.config), "--yes")

            def serves_the_new_body(report: dict) -> bool:  # type: ignore[type-arg]
                statement = report["revision"]["statement"] or {}
                return bool(statement.get("root") == after.root)

            report = await wait_status(follower, serves_the_new_body)
            assert report["revision"]["active"] == 3
            assert report["revision"]["sequence"] == after.sequence
            code, data = await revision_bytes(follower)
            assert code == 200 and statement_of(data).body_sha256 == after.body_sha256


async def test_a_deleted_accepted_file_is_restored_from_the_statement_passed_on(
    tmp_path: Path
) -> None:
    """Without ``lkg.bin.accepted`` a restart must still refuse a replay of an older statement."""
    from datetime import UTC, datetime, timedelta

    from supervisor.sinks.lkg import format_verify_key
    from tests.fakes.statements import Root

    signer = Root()
    now = datetime.now(UTC)
    older = signer.sign(1, sequence=1, issued_at=now - timedelta(seconds=30))
    hostile = HostileUpstream(signer.sign(3, sequence=3, issued_at=now))
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await nursery.start(hostile.serve)
            follower = make_node(tmp_path, "f", hostile.url,
                                 [format_verify_key(signer.key.verify_key)],
                                 control_plane="listen = false")
            accepted = Path(str(follower.cache) + ".accepted")
            async with run_daemon(follower.config) as f:
                await wait_active(follower, 3)
                f.signal(signal.SIGTERM)
                assert await f.wait() == 0
            accepted.unlink()
            hostile.data = older  # a genuine statement, still unexpired, replayed
            async with run_daemon(follower.config):
                report = await wait_status(follower, rejected("rollback"))
                assert report["revision"]["active"] == 3
                assert json.loads(accepted.read_text())["sequence"] == 3
            nursery.cancel_scope.cancel()
