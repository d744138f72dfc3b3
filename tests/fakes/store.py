"""An in-memory control-plane store: the convergence loop's seam, without a database."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import trio

from supervisor.controlplane.errors import ControlPlaneError, FailureCategory, Incompatible
from supervisor.controlplane.migrations import Migrated
from supervisor.controlplane.revisions import DesiredChange, RevisionSummary
from supervisor.controlplane.store import LoadedRevision, RevisionAdmin, RevisionPointer
from supervisor.sinks.state import Candidate

__all__ = ["FakeStore", "MovedBetweenTheReads", "RefusingStore", "SlowStore"]

#: The schema version the fake reports as migrated.
SCHEMA_VERSION = 2


@dataclass
class FakeStore:
    """In-memory RevisionAdmin; ``outage`` makes every call fail as unavailable.

    Every method of the Protocol is here (``tests/unit/test_fakes_conform.py``
    holds it to the Protocol with mypy). ``put`` publishes without an await, for
    arranging a test; ``changes`` records each move of the desired pointer.
    """

    revisions: dict[int, bytes] = field(default_factory=dict)
    desired_id: int | None = None
    outage: bool = False
    corrupt: set[int] = field(default_factory=set)
    identity: str | None = "fake:1"
    calls: list[tuple[str, float]] = field(default_factory=list)
    messages: dict[int, str | None] = field(default_factory=dict)
    changelog: list[DesiredChange] = field(default_factory=list)

    def put(self, body: bytes, message: str | None = None) -> int:
        rid = max(self.revisions, default=0) + 1
        self.revisions[rid] = body
        self.messages[rid] = message
        self._point(rid, message)
        return rid

    def _point(self, rid: int, message: str | None) -> None:
        self.desired_id = rid
        self.changelog.append(DesiredChange(sequence=len(self.changelog) + 1, revision_id=rid,
                                            changed_at=None, changed_by="fake",
                                            message=message))

    def _loaded(self, rid: int) -> LoadedRevision:
        body = self.revisions[rid]
        try:
            version = json.loads(body.decode()).get("schema_version", 1)
        except ValueError:
            version = 1  # the decoder, not the store, refuses an undecodable body
        return LoadedRevision(id=rid, schema_version=version, body=body,
                              created_at=datetime.now(UTC), message=self.messages.get(rid),
                              body_sha256=hashlib.sha256(body).digest())

    def _check(self, what: str) -> None:
        self.calls.append((what, trio.current_time()))
        if self.outage:
            raise ControlPlaneError("connection refused", category=FailureCategory.UNAVAILABLE)

    async def desired(self) -> int | None:
        self._check("desired")
        return self.desired_id

    async def observe(self) -> RevisionPointer | None:
        self._check("desired")
        if self.desired_id is None:
            return None
        body = self.revisions.get(self.desired_id)
        return RevisionPointer(self.desired_id,
                               None if body is None else hashlib.sha256(body).digest(),
                               self.identity)

    async def hydrate(self) -> Candidate | None:
        self._check("hydrate")
        if self.desired_id is None:
            return None
        rid = self.desired_id
        if rid in self.corrupt:
            raise ControlPlaneError("digest mismatch", category=FailureCategory.CORRUPT,
                                    revision=rid)
        loaded = self._loaded(rid)
        if loaded.schema_version > 1:
            raise Incompatible(rid, loaded.schema_version, 1)
        return Candidate(loaded.id, loaded.body_sha256, loaded.body, loaded.schema_version)

    async def publish(self, body: bytes, schema_version: int, message: str | None) -> int:
        return self.put(body, message)

    async def migrate(self) -> Migrated:
        return Migrated(before=SCHEMA_VERSION, after=SCHEMA_VERSION)

    async def history(self, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        self._check("history")
        newest = sorted(self.revisions, reverse=True)[:limit]
        return self.desired_id, [
            RevisionSummary(id=rid, schema_version=loaded.schema_version,
                            size=len(loaded.body), body_sha256=loaded.body_sha256,
                            created_at=loaded.created_at, message=loaded.message)
            for rid in newest for loaded in (self._loaded(rid),)]

    async def revision(self, revision: int) -> LoadedRevision:
        self._check("revision")
        if revision not in self.revisions:
            raise _not_found(revision)
        if revision in self.corrupt:
            raise ControlPlaneError("digest mismatch", category=FailureCategory.CORRUPT,
                                    revision=revision)
        return self._loaded(revision)

    async def rollback(self, revision: int, body_sha256: bytes,
                       message: str | None = None) -> int | None:
        self._check("rollback")
        body = self.revisions.get(revision)
        if body is None or hashlib.sha256(body).digest() != body_sha256:
            raise _not_found(revision)
        replaced = self.desired_id
        self._point(revision, message)
        return replaced

    async def prune(self, keep: int) -> list[int]:
        self._check("prune")
        older = sorted(self.revisions, reverse=True)[keep:]
        pruned = sorted(rid for rid in older if rid != self.desired_id)
        for rid in pruned:
            del self.revisions[rid]
        return pruned

    async def changes(self, limit: int | None) -> list[DesiredChange]:
        self._check("changes")
        return list(reversed(self.changelog))[:limit]

    async def aclose(self) -> None:
        pass


@dataclass
class RefusingStore(FakeStore):
    """A FakeStore whose observe or hydrate raises the error set for it (counted as a read first).

    ``observe_error`` stands for a refused or failed read of the desired pointer,
    ``hydrate_error`` for one of the desired revision; None reads as FakeStore does.
    """

    observe_error: Exception | None = None
    hydrate_error: Exception | None = None

    async def observe(self) -> RevisionPointer | None:
        if self.observe_error is not None:
            self._check("desired")
            raise self.observe_error
        return await super().observe()

    async def hydrate(self) -> Candidate | None:
        if self.hydrate_error is not None:
            self._check("hydrate")
            raise self.hydrate_error
        return await super().hydrate()


@dataclass
class SlowStore(FakeStore):
    """Every read sees the store as it starts, then takes ``delay_s`` of (virtual) time.

    ``in_flight`` counts the observes under way: a test waits for one to know an
    attempt is reading.
    """

    delay_s: float = 1.0
    in_flight: int = 0

    async def observe(self) -> RevisionPointer | None:
        self.in_flight += 1
        try:
            pointer = await super().observe()
            await trio.sleep(self.delay_s)
            return pointer
        finally:
            self.in_flight -= 1

    async def hydrate(self) -> Candidate | None:
        loaded = await super().hydrate()
        await trio.sleep(self.delay_s)
        return loaded


@dataclass
class MovedBetweenTheReads(FakeStore):
    """A FakeStore whose desired pointer moves between one attempt's observe and its hydrate.

    ``between`` (run once, after the next observe) moves it: a publish, or
    ``desired_id`` set back, landing between the two reads.
    """

    between: Callable[[FakeStore], object] | None = None

    async def observe(self) -> RevisionPointer | None:
        pointer = await super().observe()
        if self.between is not None:
            move, self.between = self.between, None
            move(self)
        return pointer


def _not_found(revision: int) -> ControlPlaneError:
    return ControlPlaneError(f"revision {revision} not found",
                             category=FailureCategory.NOT_FOUND, revision=revision)


if TYPE_CHECKING:
    # mypy holds the fake to the whole Protocol (tests/unit/test_fakes_conform.py runs it).
    _conforms: type[RevisionAdmin] = FakeStore
