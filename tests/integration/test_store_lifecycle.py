"""The revision lifecycle's store calls on both control planes: history, read, rollback, prune."""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
from collections.abc import AsyncIterator

import psycopg
import pytest
import trio

from supervisor import reasons
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from supervisor.controlplane.store import RevisionAdmin
from tests.stores import doc, make_store, waits_on_the_desired_row


@pytest.fixture(params=["postgresql", "sqlite"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_url" if request.param == "postgresql"
                                       else "sqlite_url"))


@pytest.fixture
async def store(url: str) -> AsyncIterator[RevisionAdmin]:
    s = make_store(url, max_revision_bytes=4096)
    await s.migrate()
    try:
        yield s
    finally:
        await s.aclose()


def _sql(url: str, statement: str, params: tuple[object, ...] = ()) -> None:
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            conn.execute(statement.replace("%s", "?"), params)
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute(statement, params)  # type: ignore[arg-type]


async def test_history_newest_first_with_the_desired_one(store: RevisionAdmin) -> None:
    with trio.fail_after(30):
        assert await store.history(None) == (None, [])
        ids = [await store.publish(doc(n=i), 1, f"m{i}") for i in range(4)]
        desired, rows = await store.history(None)
        assert desired == ids[-1]
        assert [r.id for r in rows] == ids[::-1]
        assert rows[0].message == "m3" and rows[0].schema_version == 1
        assert rows[0].size == len(doc(n=3))
        assert rows[0].body_sha256 == hashlib.sha256(doc(n=3)).digest()
        assert rows[0].created_at is not None
        desired, rows = await store.history(2)
        assert [r.id for r in rows] == ids[:1:-1] and desired == ids[-1]


async def test_read_a_revision_and_its_refusals(store: RevisionAdmin, url: str) -> None:
    with trio.fail_after(30):
        first = await store.publish(doc(n=1), 1, "one")
        got = await store.revision(first)
        assert got.body == doc(n=1) and got.message == "one" and got.id == first
        with pytest.raises(ControlPlaneError) as missing:
            await store.revision(999)
        assert missing.value.category is FailureCategory.NOT_FOUND
        assert missing.value.revision == 999
        # Stored by plain SQL: a newer schema is returned as stored; a bad digest is corrupt.
        body = doc(n=2)
        _sql(url, "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                  " VALUES (%s, %s, %s)", (7, body, hashlib.sha256(body).digest()))
        _sql(url, "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                  " VALUES (%s, %s, %s)", (1, body, hashlib.sha256(b"other").digest()))
        assert (await store.revision(first + 1)).schema_version == 7
        with pytest.raises(ControlPlaneError) as corrupt:
            await store.revision(first + 2)
        assert corrupt.value.category is FailureCategory.CORRUPT
        big = await store.publish(b'{"schema_version": 1, "pad": "' + b"x" * 4000 + b'"}',
                                  1, None)
        assert (await store.revision(big)).id == big
        await store.aclose()
        small = make_store(url, max_revision_bytes=1024)
        try:
            with pytest.raises(ControlPlaneError) as too_big:
                await small.revision(big)
            assert too_big.value.reason == "denied"
        finally:
            await small.aclose()


async def test_rollback_repoints_desired_only_at_the_same_revision(
    store: RevisionAdmin,
) -> None:
    with trio.fail_after(30):
        one = await store.publish(doc(n=1), 1, None)
        two = await store.publish(doc(n=2), 1, None)
        await store.rollback(one, hashlib.sha256(doc(n=1)).digest())
        assert await store.desired() == one
        for rev, digest in ((999, hashlib.sha256(doc(n=1)).digest()),
                            (two, hashlib.sha256(doc(n=1)).digest())):
            with pytest.raises(ControlPlaneError) as refused:
                await store.rollback(rev, digest)
            assert refused.value.category is FailureCategory.NOT_FOUND
        assert await store.desired() == one  # a refused rollback changes nothing


async def test_rollback_says_which_revision_it_replaced(store: RevisionAdmin) -> None:
    with trio.fail_after(30):
        one = await store.publish(doc(n=1), 1, None)
        two = await store.publish(doc(n=2), 1, None)
        assert await store.rollback(one, hashlib.sha256(doc(n=1)).digest()) == two
        assert await store.rollback(one, hashlib.sha256(doc(n=1)).digest()) == one


async def test_rollback_racing_a_publish_reports_the_revision_it_replaced(pg_url: str) -> None:
    """``rollback`` prints "desired revision A -> B": A must be what B replaced.

    A publish holds the desired row (its transaction moved desired to a new
    revision, not yet committed) while the rollback starts. Read apart from the
    write, "previous" was the revision before that publish: the operator was told
    the rollback replaced a revision that had not been desired for a moment.
    """
    store = make_store(pg_url, max_revision_bytes=4096)
    await store.migrate()
    try:
        with trio.fail_after(30):
            one = await store.publish(doc(n=1), 1, None)
            await store.publish(doc(n=2), 1, None)
            with psycopg.connect(pg_url) as publisher:
                racing = publisher.execute(
                    "INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                    " VALUES (1, %s, sha256(%s)) RETURNING id", (doc(n=3), doc(n=3))
                ).fetchone()[0]  # type: ignore[index]
                publisher.execute("UPDATE supervisor_desired SET revision_id = %s", [racing])
                replaced: list[int | None] = []

                async def roll_back() -> None:
                    replaced.append(await store.rollback(one, hashlib.sha256(doc(n=1)).digest()))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(roll_back)
                    await waits_on_the_desired_row(pg_url)
                    publisher.commit()
            assert replaced == [racing]
            assert await store.desired() == one
    finally:
        await store.aclose()


async def test_prune_keeps_the_newest_and_the_desired(store: RevisionAdmin) -> None:
    with trio.fail_after(30):
        assert await store.prune(3) == []
        ids = [await store.publish(doc(n=i), 1, None) for i in range(6)]
        await store.rollback(ids[0], hashlib.sha256(doc(n=0)).digest())
        assert await store.prune(2) == ids[1:4]
        _, rows = await store.history(None)
        assert [r.id for r in rows] == [ids[5], ids[4], ids[0]]
        assert await store.prune(2) == []  # harmless to repeat
        assert await store.prune(0) == [ids[4], ids[5]]
        assert (await store.history(None))[1][0].id == ids[0]
        assert (await store.hydrate()) is not None


async def test_rollback_racing_a_prune_is_not_found(pg_url: str) -> None:
    """A prune that deletes the target while a rollback waits on the desired row: NOT_FOUND.

    The prune's transaction holds the desired row and has deleted the target; the
    rollback's statement read the target before that commit and waits on the row.
    After the commit its foreign key check fails: that must read as "does not
    exist", not as a raw foreign-key error (exit 1, "try again").
    """
    store = make_store(pg_url, max_revision_bytes=4096)
    await store.migrate()
    try:
        with trio.fail_after(30):
            old = await store.publish(doc(n=1), 1, None)
            await store.publish(doc(n=2), 1, None)
            with psycopg.connect(pg_url) as pruner:
                pruner.execute("SELECT revision_id FROM supervisor_desired WHERE singleton"
                               " FOR UPDATE")
                pruner.execute("DELETE FROM supervisor_revisions WHERE id = %s", [old])
                outcome: list[BaseException | None] = []

                async def roll_back() -> None:
                    try:
                        await store.rollback(old, hashlib.sha256(doc(n=1)).digest())
                        outcome.append(None)
                    except ControlPlaneError as exc:
                        outcome.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(roll_back)
                    # Commit only once the rollback waits on the desired row's lock
                    # (outside state: another session's lock wait, polled).
                    await waits_on_the_desired_row(pg_url)
                    pruner.commit()
            [refused] = outcome
            assert isinstance(refused, ControlPlaneError), refused
            assert refused.category is FailureCategory.NOT_FOUND, refused
            assert str(refused) == f"revision {old} does not exist"
            assert await store.desired() != old
    finally:
        await store.aclose()


async def test_a_message_at_the_bound_is_whole_and_one_byte_over_is_cut_on_a_character(
        store: RevisionAdmin) -> None:
    """The bound is 4096 bytes, read as 4096 characters (left/substr) and a byte length:
    exactly 4096 bytes stay whole, one more is cut within 4096 bytes, never inside a
    character; no message reads as None."""
    with trio.fail_after(30):
        for n, message in enumerate(("a" * 4096, "é" * 2048, "a" * 4095 + "é", "😀" * 1025, "a" * 4097,
                                     "é" * 4096, None)):
            rid = await store.publish(doc(n=n), 1, message)
            read = (await store.revision(rid)).message
            if message is None or len(message.encode()) <= 4096:
                assert read == message
                continue
            assert read is not None and read.endswith(f"… ({len(message.encode())} bytes)")
            head = read.removesuffix(f"… ({len(message.encode())} bytes)")
            assert len(read.encode()) <= 4096 and message.startswith(head)
            assert len(read.encode()) > 4096 - 4 - len(f"… ({len(message.encode())} bytes)")


async def test_a_long_message_is_read_cut_to_4_kib_and_marked(store: RevisionAdmin) -> None:
    """Cut in the query itself, never refused: every read says the full length."""
    with trio.fail_after(30):
        message = "é" * 100_000
        rid = await store.publish(doc(), 1, message)
        cut = "… (200000 bytes)"
        message = (await store.revision(rid)).message
        assert message is not None
        assert message.endswith(cut) and len(message.encode()) <= 4096
        assert message.startswith("é" * 2000)
        assert (await store.history(1))[1][0].message == message
        short = await store.publish(doc(n=2), 1, "short")
        assert (await store.revision(short)).message == "short"


async def test_two_stores_publishing_at_once_get_distinct_ids_each_recorded_once(
        store: RevisionAdmin, url: str) -> None:
    """Two connections race for the write lock: each publish learns its own id, the
    pointer ends at the newest and each change carries its own publish's message."""
    second = make_store(url)
    ids: list[int] = []

    async def publish(on: RevisionAdmin, name: str) -> None:
        for n in range(12):
            ids.append(await on.publish(doc(by=name, n=n), 1, f"{name} {n}"))

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish, store, "first")
                nursery.start_soon(publish, second, "second")
            assert len(set(ids)) == 24
            assert await store.desired() == max(ids)
            changes = await second.changes(None)
            assert sorted(c.revision_id for c in changes) == sorted(ids)
            for change in changes:
                loaded = await store.revision(change.revision_id)
                assert change.message == loaded.message and change.changed_by
    finally:
        await second.aclose()


async def test_rollbacks_racing_publishes_each_report_the_revision_they_replaced(
        store: RevisionAdmin, url: str) -> None:
    """On two connections: every rollback's "previous" is the change just before its own."""
    second = make_store(url)
    replaced: list[int | None] = []
    try:
        with trio.fail_after(30):
            target = await store.publish(doc(n=0), 1, "target")

            async def roll_back() -> None:
                for _ in range(10):
                    replaced.append(await store.rollback(
                        target, hashlib.sha256(doc(n=0)).digest(), "back"))

            async def publish() -> None:
                for n in range(1, 11):
                    await second.publish(doc(n=n), 1, None)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(roll_back)
                nursery.start_soon(publish)
            changes = sorted(await store.changes(None), key=lambda c: c.sequence)
            assert [c.sequence for c in changes] == list(range(1, 22))
            before = {c.sequence: p.revision_id for p, c in itertools.pairwise(changes)}
            assert replaced == [before[c.sequence] for c in changes if c.message == "back"]
    finally:
        await second.aclose()


async def test_prune_keeping_one_keeps_an_old_desired_and_a_rollback_to_a_pruned_one_is_not_found(
        store: RevisionAdmin) -> None:
    with trio.fail_after(30):
        ids = [await store.publish(doc(n=n), 1, None) for n in range(4)]
        await store.rollback(ids[0], hashlib.sha256(doc(n=0)).digest())
        assert await store.prune(1) == ids[1:3]
        desired, rows = await store.history(None)
        assert desired == ids[0] and [r.id for r in rows] == [ids[3], ids[0]]
        loaded = await store.hydrate()
        assert loaded is not None and loaded.id == ids[0]
        for n, gone in enumerate(ids[1:3], start=1):
            with pytest.raises(ControlPlaneError) as info:
                await store.rollback(gone, hashlib.sha256(doc(n=n)).digest(), "back")
            assert info.value.category is FailureCategory.NOT_FOUND
            assert info.value.reason == reasons.NOT_FOUND
        assert await store.desired() == ids[0]
        assert len(await store.changes(None)) == 5  # the refused rollbacks wrote nothing


async def test_a_null_message_beside_a_huge_one_in_history_and_changes(
        store: RevisionAdmin) -> None:
    huge = "é" * 300_000
    with trio.fail_after(30):
        quiet = await store.publish(doc(n=1), 1, None)
        loud = await store.publish(doc(n=2), 1, huge)
        desired, rows = await store.history(None)
        assert desired == loud and [r.id for r in rows] == [loud, quiet]
        assert rows[1].message is None
        assert rows[0].message is not None and rows[0].message.startswith("é" * 100)
        assert len(rows[0].message.encode()) < 5000  # cut to the bound, on a character
        changes = await store.changes(None)
        assert [c.message for c in changes] == [huge, None]
        assert await store.history(0) == (loud, [])
        assert await store.changes(0) == []


async def test_history_without_a_desired_row_lists_the_revisions_and_no_pointer(
        store: RevisionAdmin, url: str) -> None:
    with trio.fail_after(30):
        ids = [await store.publish(doc(n=n), 1, None) for n in range(3)]
        _sql(url, "DELETE FROM supervisor_desired")
        desired, rows = await store.history(None)
        assert desired is None and [r.id for r in rows] == ids[::-1]
        assert await store.history(0) == (None, [])
        assert await store.desired() is None and await store.hydrate() is None
        assert await store.prune(1) == ids[:2]  # no desired revision to keep
        assert await store.rollback(ids[2], hashlib.sha256(doc(n=2)).digest()) is None
        assert await store.desired() == ids[2]
