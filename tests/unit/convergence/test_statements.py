"""The signed statement a loop serves under, and the root's bytes a follower keeps.

A root signs what it publishes (its sequence, its control plane's identity, a
lifetime of ``statement_ttl_s`` from its wall clock) and, while converged,
signs it anew past half that lifetime or when the sequence or identity moved,
only after a successful read. A follower serves under the root's statement and
writes the root's signed bytes to its forward file before its cache; a fresher
statement of the same revision is passed on once. Fake store, real signed
cache on a temporary directory, virtual time and a settable wall clock.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from supervisor.controlplane.store import RevisionPointer
from supervisor.convergence import side_sinks
from supervisor.convergence.outcome import OutcomeKind
from supervisor.convergence.status import RevisionStatus
from supervisor.sinks.lkg import LastKnownGood, Statement
from supervisor.sinks.state import ActiveState, Candidate
from tests.convergence import doc, events_of, make, real_cache, sample, watched, with_cache
from tests.fakes.statements import Root, statement_of
from tests.fakes.store import FakeStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


BODY = doc("a")


HUB = "http://hub:9464"


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class RootStore(FakeStore):
    """The fake store read as a root's: every read carries the pointer's sequence (its moves).

    ``reads_sequence`` False: the observe does not learn it (None).
    """

    reads_sequence = True

    async def observe(self) -> RevisionPointer | None:
        pointer = await super().observe()
        sequence = len(self.changelog) if self.reads_sequence else None
        return None if pointer is None else replace(pointer, sequence=sequence)

    async def hydrate(self) -> Candidate | None:
        loaded = await super().hydrate()
        return None if loaded is None else replace(loaded, sequence=len(self.changelog))


class UpstreamStore(FakeStore):
    """A follower's upstream desiring revision 1 (BODY): every read carries the root's statement."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Root()
        self.put(BODY)
        self.sign(T0)

    def sign(self, issued_at: datetime) -> None:
        """The root signs revision 1 anew (the same sequence), issued at ``issued_at``."""
        self.signed = self.root.sign(1, sequence=7, body=BODY, issued_at=issued_at)

    def statement(self) -> Statement:
        return statement_of(self.signed)

    async def observe(self) -> RevisionPointer | None:
        pointer = await super().observe()
        statement = self.statement()
        return (
            None
            if pointer is None
            else replace(pointer, sequence=statement.sequence, statement=statement)
        )

    async def hydrate(self) -> Candidate | None:
        loaded = await super().hydrate()
        statement = self.statement()
        return (
            None
            if loaded is None
            else replace(loaded, sequence=statement.sequence, statement=statement)
        )


def cached_statement(cache: LastKnownGood) -> Statement | None:
    cached = cache.load()
    assert cached is not None
    return cached.statement


def a_root(tmp_path: Path, store: RootStore | None = None) -> tuple[Any, RootStore, Clock]:
    """A root's loop (a signing cache, a 60 s lifetime) on ``store``, which desires BODY."""
    store = store or RootStore()
    store.put(BODY)
    clock = Clock()
    rec = make(store, cache=real_cache(tmp_path), wall_clock=clock, statement_ttl_s=60.0)
    return rec, store, clock


async def test_a_root_signs_what_it_publishes_with_its_sequence_and_identity(
    tmp_path: Path,
) -> None:
    rec, _store, _clock = a_root(tmp_path)
    assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED
    signed = rec.state.statement
    assert signed == Statement(
        1, hashlib.sha256(BODY).hexdigest(), 1, "fake:1", T0, T0 + timedelta(seconds=60)
    )
    assert cached_statement(rec.sinks.cache) == signed
    assert rec.status.report().sequence == 1


async def test_nothing_is_signed_without_a_signing_key_or_a_sequence(tmp_path: Path) -> None:
    store = RootStore()
    store.put(BODY)
    unkeyed, _ = with_cache(store)  # a cache without a signing key
    await unkeyed.converge_once()
    assert unkeyed.state.statement is None
    unread = FakeStore()  # a store that does not read the sequence
    unread.put(BODY)
    rec = make(unread, cache=real_cache(tmp_path))
    await rec.converge_once()
    assert rec.state.statement is None and cached_statement(rec.sinks.cache) is None


async def test_a_converged_root_signs_again_past_half_the_lifetime(tmp_path: Path) -> None:
    rec, _store, clock = a_root(tmp_path)
    await rec.converge_once()
    first = rec.state.statement
    clock.advance(29)
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert rec.state.statement is first and cached_statement(rec.sinks.cache) == first
    clock.advance(1)
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    fresh = rec.state.statement
    assert fresh == replace(
        first, issued_at=T0 + timedelta(seconds=30), expires_at=T0 + timedelta(seconds=90)
    )
    assert cached_statement(rec.sinks.cache) == fresh
    assert rec.status.generation == 1  # the same snapshot serves on


async def test_a_root_signs_again_when_its_sequence_moves(tmp_path: Path) -> None:
    rec, store, _ = a_root(tmp_path)
    await rec.converge_once()
    # The pointer moved (an operator's rollback to what serves): a higher sequence.
    await store.rollback(1, hashlib.sha256(BODY).digest())
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert rec.state.statement is not None and rec.state.statement.sequence == 2
    assert cached_statement(rec.sinks.cache) == rec.state.statement
    assert rec.status.report().sequence == 2


async def test_what_serves_follows_the_sequence_also_without_a_signing_key() -> None:
    store = RootStore()
    store.put(BODY)
    rec = make(store)  # no cache: nothing is signed
    await rec.converge_once()
    assert (rec.state.statement, rec.status.report().sequence) == (None, 1)
    await store.rollback(1, hashlib.sha256(BODY).digest())
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert (rec.state.statement, rec.status.report().sequence) == (None, 2)


async def test_a_statement_signed_as_unknown_is_signed_again_once_the_root_names_itself(
    tmp_path: Path,
) -> None:
    rec, store, _ = a_root(tmp_path, RootStore(identity=None))
    await rec.converge_once()
    assert rec.state.statement is not None and rec.state.statement.root == "unknown"
    store.identity = "fake:1"
    await rec.converge_once()
    assert rec.state.statement.root == "fake:1"
    assert cached_statement(rec.sinks.cache) == rec.state.statement


async def test_a_root_that_cannot_read_its_control_plane_lets_its_statement_age(
    tmp_path: Path,
) -> None:
    rec, store, clock = a_root(tmp_path)
    await rec.converge_once()
    first = rec.state.statement
    store.outage = True
    clock.advance(61)
    await rec.converge_once()
    assert rec.state.statement is first and cached_statement(rec.sinks.cache) == first
    assert rec.status.report().statement.stale is True


async def test_a_restarted_root_serves_under_a_statement_signed_anew(tmp_path: Path) -> None:
    first, store, clock = a_root(tmp_path)
    await first.converge_once()
    clock.advance(10)
    # A new child run shares the serving state and re-writes the sinks at its first attempt.
    second = make(
        store, status=first.status, cache=first.sinks.cache, wall_clock=clock, statement_ttl_s=60.0
    )
    assert (await second.converge_once()).kind is OutcomeKind.CONVERGED
    signed = second.state.statement
    assert signed is not None and signed.issued_at == T0 + timedelta(seconds=10)
    assert cached_statement(second.sinks.cache) == signed


def follower(tmp_path: Path, store: UpstreamStore, **kw: Any) -> Any:
    status = RevisionStatus(ActiveState(upstream=HUB))
    return watched(
        store,
        status=status,
        cache=real_cache(tmp_path),
        forward_to=str(tmp_path / "cache" / "lkg.bin.upstream"),
        **kw,
    )


async def test_a_follower_serves_under_the_roots_statement_and_keeps_its_bytes(
    tmp_path: Path,
) -> None:
    store = UpstreamStore()
    rec, seen = follower(tmp_path, store)
    assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED
    assert rec.state.statement == store.statement()
    assert rec.state.statement.etag() == store.statement().etag()
    assert cached_statement(rec.sinks.cache) == store.statement()
    forward = Path(rec.sinks.forward_to)
    assert forward.read_bytes() == store.signed
    assert stat.S_IMODE(forward.stat().st_mode) == 0o600
    # What it published is told as coming from its upstream.
    published = [e for e in events_of(seen) if e["type"] == "published"]
    assert [e["source"] for e in published] == [HUB]
    assert seen.status == [f"serving revision 1 (generation 1, {HUB})"]


async def test_a_converged_follower_passes_a_fresher_statement_on_once(tmp_path: Path) -> None:
    store = UpstreamStore()
    rec, _ = follower(tmp_path, store)
    await rec.converge_once()
    forward = Path(rec.sinks.forward_to)
    store.sign(T0 + timedelta(seconds=30))
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    fresh = store.statement()
    assert rec.state.statement == fresh
    assert cached_statement(rec.sinks.cache) == fresh
    assert forward.read_bytes() == store.signed
    written = forward.stat().st_ino
    await rec.converge_once()  # the same statement: nothing to pass on
    assert forward.stat().st_ino == written


async def test_a_forward_file_that_cannot_be_written_never_blocks_serving(
    tmp_path: Path,
) -> None:
    store = UpstreamStore()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    rec = make(
        store,
        status=RevisionStatus(ActiveState(upstream=HUB)),
        cache=real_cache(tmp_path),
        forward_to=str(blocked / "lkg.bin.upstream"),
    )
    with structlog.testing.capture_logs() as logs:
        assert (await rec.converge_once()).kind is OutcomeKind.PUBLISHED
    assert cached_statement(rec.sinks.cache) == store.statement()
    assert sample(rec.report.metrics, "supervisor_sink_write_failures_total", sink="cache") == 1
    assert [
        e["log_level"]
        for e in logs
        if e["event"].startswith("cannot keep the root's signed statement")
    ] == ["warning"]


async def test_a_shutdown_while_a_fresher_statement_is_passed_on_still_serves_under_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = UpstreamStore()
    rec, _ = follower(tmp_path, store)
    await rec.converge_once()
    entered, release = threading.Event(), threading.Event()
    write = side_sinks.write_atomic

    def held(path: str, data: bytes, **kw: Any) -> os.stat_result:
        entered.set()
        release.wait(10)
        return write(path, data, **kw)

    monkeypatch.setattr(side_sinks, "write_atomic", held)
    store.sign(T0 + timedelta(seconds=30))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rec.converge_once)
            await trio.to_thread.run_sync(entered.wait, 10)
            nursery.cancel_scope.cancel()  # a SIGTERM while the forward file is being written
            release.set()
    # The forward file, the cache and what serves agree on the fresher statement.
    assert Path(rec.sinks.forward_to).read_bytes() == store.signed
    assert cached_statement(rec.sinks.cache) == store.statement()
    assert rec.state.statement == store.statement()


async def test_a_read_without_a_sequence_keeps_the_sequence_of_what_serves() -> None:
    store = RootStore()
    store.put(BODY)
    rec = make(store)  # no cache: nothing is signed
    await rec.converge_once()
    assert rec.status.report().sequence == 1
    store.reads_sequence = False  # a read that did not learn the sequence
    assert (await rec.converge_once()).kind is OutcomeKind.CONVERGED
    assert rec.status.report().sequence == 1
