"""The convergence loop against real PostgreSQL (a fresh database per test)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import trio

from supervisor import reasons
from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.factory import open_admin
from supervisor.convergence.loop import ConvergenceLoop
from supervisor.convergence.outcome import OutcomeKind
from supervisor.events import Published
from supervisor.revision.document import SCHEMA_VERSION
from supervisor.revision.secrets import EnvFileResolver
from tests.convergence import make


def body(*aliases: str, **extra: Any) -> bytes:
    doc = {"schema_version": 1,
           "aliases": {a: {"upstream": f"https://{a}.example/v1"} for a in aliases}}
    doc.update(extra)
    return json.dumps(doc).encode()


def reconciler(url: str, **cp: Any) -> ConvergenceLoop:
    config = ControlPlaneConfig(url=url, **cp)
    return make(open_admin(config, max_schema_version=SCHEMA_VERSION, statement_timeout_s=30),
                poll_interval_s=config.poll_interval_s,
                backoff_initial_s=config.backoff_initial_s, backoff_max_s=config.backoff_max_s,
                resolver=EnvFileResolver({"TEAM_A_KEY": "s3cret"}))


async def test_missed_notification_polling_publishes_within_one_interval(pg_url: str) -> None:
    rec = reconciler(pg_url, poll_interval_s=0.5, listen=False)
    await rec.source.migrate()
    await rec.source.publish(body("a"), 1, "first")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(rec.run)
            with rec.report.events.subscribe() as sub:
                # Published with plain SQL and no listener: only polling can see it.
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    rid = conn.execute(
                        "INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)"
                        " VALUES (1, %s, sha256(%s), 'sql') RETURNING id",
                        (body("a", "b"), body("a", "b")),
                    ).fetchone()[0]
                    conn.execute(
                        "INSERT INTO supervisor_desired (singleton, revision_id, updated_at)"
                        " VALUES (true, %s, now()) ON CONFLICT (singleton) DO UPDATE"
                        " SET revision_id = excluded.revision_id, updated_at = now()",
                        (rid,),
                    )
                committed = trio.current_time()
                async for event in sub.receive:
                    if isinstance(event, Published) and event.revision == rid:
                        break
                assert trio.current_time() - committed <= 0.5 + 0.5  # one interval + slack
            nursery.cancel_scope.cancel()
    await rec.source.aclose()


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("UPDATE supervisor_revisions SET body_sha256 = sha256('x')", reasons.CORRUPT),
        ("UPDATE supervisor_revisions SET schema_version = 2", reasons.INCOMPATIBLE),
    ],
)
async def test_store_faults_reach_status_and_keep_nothing(pg_url: str, sql: str, reason: str) -> None:
    rec = reconciler(pg_url)
    await rec.source.migrate()
    await rec.source.publish(body("a"), 1, None)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql)
    with trio.fail_after(20):
        outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.REJECTED and outcome.reason == reason
    assert rec.state.snapshot is None
    assert rec.status.report().last_rejection.reason == reason
    await rec.source.aclose()


async def test_rejected_revision_keeps_previous_then_good_one_publishes(pg_url: str) -> None:
    rec = reconciler(pg_url)
    await rec.source.migrate()
    with trio.fail_after(20):
        await rec.source.publish(body("a"), 1, None)
        assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED
        serving = rec.state.snapshot
        bad = await rec.source.publish(
            body("a", keys={"team-a": {"secret": "env:TEAM_A_KEY", "aliases": ["zzz"]}}), 1, None)
        outcome = await rec.converge_once()
        assert outcome.reason == reasons.PROJECTION and outcome.revision == bad
        assert rec.state.snapshot is serving
        missing = await rec.source.publish(
            body("a", keys={"team-a": {"secret": "env:NOT_SET_ANYWHERE", "aliases": ["a"]}}), 1,
            None)
        outcome = await rec.converge_once()
        assert outcome.reason == reasons.SECRET and outcome.revision == missing
        good = await rec.source.publish(
            body("a", keys={"team-a": {"secret": "env:TEAM_A_KEY", "aliases": ["a"]}}), 1, None)
        outcome = await rec.converge_once()
        assert outcome.kind is OutcomeKind.PUBLISHED and outcome.revision == good
    snap = rec.state.snapshot
    assert snap is not None
    assert b"s3cret" not in snap.to_json()
    assert rec.status.report().consecutive_failures == 0
    await rec.source.aclose()


async def test_cancelling_during_a_hung_hydration_is_prompt(pg_url: str) -> None:
    rec = reconciler(pg_url)
    await rec.source.migrate()
    await rec.source.publish(body("a"), 1, None)
    with psycopg.connect(pg_url) as locker:
        locker.execute("LOCK TABLE supervisor_revisions IN ACCESS EXCLUSIVE MODE")
        with trio.fail_after(10):
            start = trio.current_time()
            with trio.move_on_after(1.0) as scope:
                await rec.converge_once()
            cancelled_at = trio.current_time()
        assert scope.cancelled_caught  # it really hung on the lock
        assert cancelled_at - start < 3.0  # 1 s in the query, then the cancel is prompt
        # The attempt was stuck on the lock and has unwound within the guard.
        assert rec.state.snapshot is None
        locker.rollback()
    with trio.fail_after(10):
        outcome = await rec.converge_once()
    assert outcome.kind is OutcomeKind.PUBLISHED
    assert cancelled_at > 0
    await rec.source.aclose()
