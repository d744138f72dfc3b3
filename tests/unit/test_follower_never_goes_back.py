"""Property: whatever the hub replays, and however often the follower restarts, it never goes back.

A model root publishes, rolls back and is restored from a backup (a new
identity, its sequence behind; the operator then runs ``follower reset`` while
the hub serves the restored root); each change is a genuine signed statement.
The hub in between serves any statement ever signed (a replay), or the latest;
the follower restarts at any point (a new store, its highest accepted read
back from the file). Invariants, for any interleaving:

* what the follower accepts never goes back: its ``issued_at`` never
  decreases, and under one root identity its sequence never decreases;
* the last operator action always wins: once the hub serves the latest
  statement, the follower accepts exactly it.
"""

from __future__ import annotations

import hashlib
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.errors import ControlPlaneError
from supervisor.controlplane.follower import FollowerStore
from supervisor.sinks.lkg import Statement, format_verify_key
from supervisor.sinks.lkg.accepted import AcceptedStatements, write_reset
from tests.fakes.statements import BODY, Root, statement_of

START = datetime(2026, 1, 1, tzinfo=UTC)

operations = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 3)),
    st.tuples(st.just("rollback"), st.integers(0, 50)),
    st.tuples(st.just("restore"), st.integers(0, 50)),
    st.tuples(st.just("replay"), st.integers(0, 50)),
    st.tuples(st.just("restart"), st.just(0)),
    st.tuples(st.just("latest"), st.just(0)),
), max_size=30)


class Model:
    def __init__(self) -> None:
        self.root = Root()
        self.generation = 0  # root identities made so far
        self.sequence = 0
        self.revisions: list[bytes] = []
        self.signed: list[bytes] = []
        self.now = START

    def sign(self, revision: int) -> None:
        self.now += timedelta(seconds=1)
        body = self.revisions[revision - 1]
        self.signed.append(self.root.sign(revision, self.sequence, body, issued_at=self.now,
                                          ttl_s=10**6))

    def publish(self, variant: int) -> None:
        self.revisions.append(BODY.replace(b"a.example", f"v{variant}.example".encode()))
        self.sequence += 1
        self.sign(len(self.revisions))

    def rollback(self, pick: int) -> None:
        self.sequence += 1
        self.sign(pick % len(self.revisions) + 1)

    def restore(self, pick: int) -> None:
        """The root's database restored from a backup: fewer revisions, sequence behind."""
        keep = pick % len(self.revisions) + 1
        self.revisions = self.revisions[:keep]
        self.sequence = max(1, self.sequence - 1 - pick % 3)
        self.generation += 1
        self.root = Root(self.root.key, identity=f"sqlite:restored:{self.generation}")
        self.sign(keep)


def follower(upstream: list[bytes], path: str, model: Model) -> FollowerStore:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=upstream[0])

    config = ControlPlaneConfig(url="http://hub.test:1",
                                trusted_keys=[format_verify_key(model.root.key.verify_key)])
    return FollowerStore(config, max_schema_version=1, accepted=AcceptedStatements(path),
                         transport=httpx.MockTransport(handle), clock=lambda: model.now)


async def run(ops: list[tuple[str, int]], directory: str) -> None:
    model = Model()
    model.publish(0)
    path = str(Path(directory) / "lkg.bin.accepted")
    served: list[Statement] = []
    upstream = [model.signed[-1]]
    store = follower(upstream, path, model)

    async def poll() -> None:
        try:
            pointer = await store.observe()
        except ControlPlaneError as exc:
            assert exc.reason in ("rollback", "corrupt", "denied"), exc
            return
        assert pointer is not None and pointer.statement is not None
        statement = pointer.statement
        if served:
            last = served[-1]
            assert statement.issued_at >= last.issued_at
            if statement.root == last.root:
                assert statement.sequence >= last.sequence
        served.append(statement)

    for op, value in ops:
        if op == "publish":
            model.publish(value)
        elif op == "rollback":
            model.rollback(value)
        elif op == "restore":
            model.restore(value)
            write_reset(path)
            upstream[0] = model.signed[-1]
            await poll()
        elif op == "replay":
            upstream[0] = model.signed[value % len(model.signed)]
            await poll()
        elif op == "restart":
            await store.aclose()
            store = follower(upstream, path, model)
        else:
            upstream[0] = model.signed[-1]
            await poll()
    upstream[0] = model.signed[-1]
    await poll()
    latest = statement_of(model.signed[-1])
    assert served[-1].etag() == latest.etag()
    assert served[-1].body_sha256 == hashlib.sha256(
        model.revisions[latest.revision - 1]).hexdigest()
    await store.aclose()


@settings(max_examples=150, deadline=None)
@given(operations)
def test_a_follower_never_goes_back_and_the_last_operator_action_wins(
    ops: list[tuple[str, int]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        trio.run(run, ops, directory)
