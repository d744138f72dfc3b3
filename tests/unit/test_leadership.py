"""The fan-out's leader election state machine, in virtual time, against the fake's Lease store.

Each elector runs a stand-in for the fan-out (``Writers.lead``) that "writes"
every 50 ms while it runs and records when; the tests check the safety
property directly: no write after leadership is lost, and never two replicas
writing at once.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

import msgspec
import pytest
import trio
import trio.testing

from supervisor.fanout.leadership import LeaderElector, LeadershipMetrics, LeadershipStatus
from supervisor.kube.lease import LeaseRecord
from supervisor.status_doc import LeadershipReport
from supervisor.telemetry import Metrics
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.leases import LEASE, StoreLeases, lease_holder

NS, NAME = "trio-supervisor", "trio-supervisor-fanout"
LEASE_S, RENEW_S, RETRY_S = 15.0, 10.0, 2.0


class Writers:
    """Stand-ins for the fan-out: who is writing, and every write's time."""

    def __init__(self) -> None:
        self.active: set[str] = set()
        self.writes: list[tuple[float, str]] = []
        self.starts: Counter[str] = Counter()
        self.overlaps: list[tuple[float, set[str]]] = []

    def lead(self, name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            self.starts[name] += 1
            try:
                while True:
                    others = self.active - {name}
                    if others:
                        self.overlaps.append((trio.current_time(), others | {name}))
                    self.active.add(name)
                    self.writes.append((trio.current_time(), name))
                    await trio.sleep(0.05)
            finally:
                self.active.discard(name)

        return run

    def last_write(self, name: str) -> float:
        return max(t for t, who in self.writes if who == name)

    def first_write(self, name: str) -> float:
        return min(t for t, who in self.writes if who == name)


class Replica:
    def __init__(self, server: FakeApiServer, name: str, writers: Writers) -> None:
        self.name = name
        self.leases = StoreLeases(server, NS, NAME, manager=name)
        self.status = LeadershipStatus()
        self.changes: list[tuple[str, str | None]] = []
        self.metrics = LeadershipMetrics(Metrics(process=False).registry)
        self.elector = LeaderElector(
            self.leases, identity=name, lease_duration_s=LEASE_S, renew_deadline_s=RENEW_S,
            retry_period_s=RETRY_S, status=self.status, metrics=self.metrics,
            on_change=lambda s: self.changes.append((s.role, s.holder)),
            rng=random.Random(name))
        self.writers = writers
        self.scope = trio.CancelScope()

    async def run(self) -> None:
        with self.scope:
            await self.elector.run(self.writers.lead(self.name))


async def wait_for(predicate: Callable[[], bool], step: float = 0.01) -> None:
    while not predicate():
        await trio.sleep(step)


class Election:
    """One Lease in a fake API server's store, the fan-out stand-ins, and the replicas electing."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.server, self.writers = FakeApiServer(), Writers()
        self.nursery = nursery

    def start(self, *names: str) -> list[Replica]:
        replicas = [Replica(self.server, name, self.writers) for name in names]
        for replica in replicas:
            self.nursery.start_soon(replica.run)
        return replicas

    async def leader(self, name: str) -> Replica:
        """Replica ``name`` started alone, once it leads."""
        replica, = self.start(name)
        await wait_for(lambda: replica.elector.leading)
        return replica

    def label_lease(self) -> None:
        """An unrelated write to the Lease (a label added by kubectl): a new resourceVersion."""
        obj = self.server.store.find(LEASE, NS, NAME)
        assert obj is not None
        labelled = {**obj, "metadata": {**obj["metadata"], "labels": {"x": "y"}}}
        self.server.store.replace(LEASE, NS, NAME, labelled, "kubectl")

    async def leader_and_standby(self) -> tuple[Replica, Replica]:
        """Replicas a and b started together, once one of them leads: (leader, standby)."""
        a, b = self.start("a", "b")
        await wait_for(lambda: a.elector.leading or b.elector.leading)
        return (a, b) if a.elector.leading else (b, a)


@asynccontextmanager
async def election(seconds: float) -> AsyncIterator[Election]:
    """An :class:`Election` whose replicas run until the block ends, within ``seconds``."""
    with trio.fail_after(seconds):
        async with trio.open_nursery() as nursery:
            yield Election(nursery)
            nursery.cancel_scope.cancel()


async def test_acquire_renew_and_standby(autojump_clock: trio.testing.MockClock) -> None:
    async with election(120) as e:
        server, writers = e.server, e.writers
        a = await e.leader("a")
        assert lease_holder(server, NS, NAME) == "a"
        assert a.status.report() == LeadershipReport(role="leader", holder="a",
                                                     lease=f"{NS}/{NAME}")
        assert a.metrics.leader._value.get() == 1.0
        obj = server.store.find(LEASE, NS, NAME)
        assert obj is not None and obj["spec"]["leaseDurationSeconds"] == 15
        first_rv = obj["metadata"]["resourceVersion"]
        b, = e.start("b")
        await trio.sleep(60)
        # Renewed every retry period; b stays standby and reports a as the holder.
        assert a.leases.calls["update"] >= 25
        assert server.store.find(LEASE, NS, NAME)["metadata"]["resourceVersion"] != first_rv
        assert a.elector.leading and not b.elector.leading
        assert b.status.report() == LeadershipReport(role="standby", holder="a",
                                                     lease=f"{NS}/{NAME}")
        assert writers.starts == Counter({"a": 1})
        assert b.leases.calls["update"] == 0 and b.leases.calls["create"] == 0
    assert not writers.overlaps


async def test_lose_by_deadline_stops_writes_before_expiry(
        autojump_clock: trio.testing.MockClock) -> None:
    async with election(300) as e:
        writers = e.writers
        a = await e.leader("a")
        b, = e.start("b")
        await trio.sleep(7)
        a.leases.unreachable = True  # a partition: a can reach nothing
        last_renewal = a.elector._renewed_at
        await wait_for(lambda: b.elector.leading)
        lost = a.elector.lost_at
        assert lost is not None
        # a stopped at the renew deadline, counted from its last renewal's start ...
        assert lost <= last_renewal + RENEW_S + 1e-9
        assert writers.last_write("a") <= lost
        # ... before b could take over (b waits a lease duration from what it observed).
        assert writers.first_write("b") >= last_renewal + LEASE_S
        assert a.status.role == "standby"
        assert ("standby", "a") in a.changes
        assert a.metrics.transitions.labels("standby")._value.get() == 1.0
    assert not writers.overlaps


async def test_split_leader_whose_renewals_are_refused(
        autojump_clock: trio.testing.MockClock) -> None:
    """Renewals fail (the server refuses a's writes) while reads work: a must stop first."""
    async with election(300) as e:
        writers = e.writers
        leader, standby = await e.leader_and_standby()
        await trio.sleep(5)
        leader.leases.refuse_writes = True
        refused_at = trio.current_time()
        await wait_for(lambda: standby.elector.leading)
        assert leader.elector.lost_at is not None
        assert leader.elector.lost_at <= refused_at + RENEW_S
        assert writers.last_write(leader.name) <= leader.elector.lost_at
        assert writers.first_write(standby.name) > leader.elector.lost_at
        # The old leader now stands by and reports the new holder.
        await wait_for(lambda: leader.status.holder == standby.name)
        assert leader.status.role == "standby"
    assert not writers.overlaps


async def test_conflict_showing_another_holder_loses_at_once(
        autojump_clock: trio.testing.MockClock) -> None:
    async with election(120) as e:
        server, writers = e.server, e.writers
        a = await e.leader("a")
        # Someone else writes the Lease (a stale-looking takeover): a's next renewal
        # carries an old resourceVersion, gets 409, re-reads and sees "intruder".
        obj = server.store.find(LEASE, NS, NAME)
        assert obj is not None
        obj = {**obj, "spec": {**obj["spec"], "holderIdentity": "intruder"}}
        server.store.replace(LEASE, NS, NAME, obj, "intruder")
        written = trio.current_time()
        await wait_for(lambda: not a.elector.leading)
        assert a.elector.lost_at is not None
        assert a.elector.lost_at - written <= RETRY_S + 0.1  # no waiting for the deadline
        assert writers.last_write("a") <= a.elector.lost_at
        assert a.status.holder == "intruder"


async def test_conflict_with_ourselves_still_holding_is_retried(
        autojump_clock: trio.testing.MockClock) -> None:
    """A 409 from an unrelated write (a label added by kubectl) is not a loss."""
    async with election(120) as e:
        writers = e.writers
        a = await e.leader("a")
        e.label_lease()
        await trio.sleep(30)
        assert a.elector.leading and writers.starts["a"] == 1


async def test_release_on_shutdown_hands_over_within_a_retry_period(
        autojump_clock: trio.testing.MockClock) -> None:
    async with election(120) as e:
        server, writers = e.server, e.writers
        leader, standby = await e.leader_and_standby()
        await trio.sleep(20)
        leader.scope.cancel()
        stopped = trio.current_time()
        await wait_for(lambda: lease_holder(server, NS, NAME) != leader.name)
        assert writers.last_write(leader.name) <= stopped
        await wait_for(lambda: standby.elector.leading)
        assert trio.current_time() - stopped <= RETRY_S + 0.1
        obj = server.store.find(LEASE, NS, NAME)
        assert obj is not None and obj["spec"]["leaseTransitions"] >= 1
    assert not writers.overlaps


async def test_reacquire_starts_the_fanout_fresh(autojump_clock: trio.testing.MockClock) -> None:
    async with election(300) as e:
        writers = e.writers
        a = await e.leader("a")
        a.leases.unreachable = True
        await wait_for(lambda: not a.elector.leading)
        assert not writers.active
        a.leases.unreachable = False  # nobody took over: the lease still names a
        await wait_for(lambda: a.elector.leading)
        assert writers.starts["a"] == 2  # a new run of the fan-out, not a resumed one
        assert a.metrics.transitions.labels("leader")._value.get() == 2.0


async def test_slow_renewals_within_the_deadline_keep_leadership(
        autojump_clock: trio.testing.MockClock) -> None:
    async with election(300) as e:
        writers = e.writers
        leader, _ = await e.leader_and_standby()
        # Each call 1.5 s: a renewal (get + update) takes 3 s; the next one starts 2 s
        # after, so each completes 5 + 3 = 8 s after the previous one started (< 10 s).
        leader.leases.latency_s = 1.5
        await trio.sleep(120)
        assert leader.elector.leading and writers.starts == Counter({leader.name: 1})


@pytest.mark.parametrize("seed", range(4))
async def test_never_two_writers_under_random_faults(
        autojump_clock: trio.testing.MockClock, seed: int) -> None:
    """Three replicas, random partitions, refusals, latency and hangs for 30 virtual minutes."""
    rng = random.Random(seed)
    async with election(4000) as e:
        writers = e.writers
        replicas = e.start("a", "b", "c")
        for _ in range(120):
            await trio.sleep(rng.uniform(1, 30))
            victim = rng.choice(replicas)
            fault = rng.choice(["unreachable", "refuse", "latency", "hang", "heal", "heal"])
            leases = victim.leases
            if fault == "unreachable":
                leases.unreachable = True
            elif fault == "refuse":
                leases.refuse_writes = True
            elif fault == "latency":
                leases.latency_s = rng.uniform(0.1, 6.0)
            elif fault == "hang":
                leases.hang = True
            else:
                leases.unreachable = leases.refuse_writes = False
                leases.latency_s = 0.0
                leases.unhang()
        for replica in replicas:
            replica.leases.unreachable = replica.leases.refuse_writes = False
            replica.leases.latency_s = 0.0
            replica.leases.unhang()
        await wait_for(lambda: sum(r.elector.leading for r in replicas) == 1)
    assert not writers.overlaps
    assert len(writers.starts) >= 2  # leadership did move


async def test_lease_record_round_trip_through_the_store(
        autojump_clock: trio.testing.MockClock) -> None:
    server = FakeApiServer()
    leases = StoreLeases(server, NS, NAME)
    assert await leases.get() is None
    created = await leases.create(LeaseRecord(holder="x", duration_s=15, transitions=0))
    assert created.holder == "x" and created.resource_version
    renewed = await leases.update(replace(created, holder="y"))
    assert renewed.holder == "y"
    from supervisor.kube.errors import Conflict

    with pytest.raises(Conflict):
        await leases.update(replace(created, holder="z"))  # stale resourceVersion
    with pytest.raises(Conflict):
        await leases.create(LeaseRecord(holder="z"))  # already exists


async def test_a_slow_read_dates_the_observation_from_its_answer(
        autojump_clock: trio.testing.MockClock) -> None:
    """A standby whose read took 9 s must not date what it saw from when it asked.

    The leader's last renewal landed near the end of that read; dated from the
    question, the standby would take over up to 9 s early, while the leader
    still writes.
    """
    async with election(300) as e:
        writers = e.writers
        a = await e.leader("a")
        b, = e.start("b")
        await trio.sleep(10)
        b.leases.read_latency_s = 9.0
        seen = b.leases.answered["get"]
        await wait_for(lambda: b.leases.answered["get"] >= seen + 2)  # one slow read
        a.leases.unreachable = True  # a renewed just before that read's answer
        b.leases.read_latency_s = 0.0
        await wait_for(lambda: b.elector.leading)
        assert a.elector.lost_at is not None
        assert writers.first_write("b") > a.elector.lost_at
    assert not writers.overlaps


async def test_release_reads_again_after_a_conflict(autojump_clock: trio.testing.MockClock) -> None:
    """The Lease changed since our last renewal (a label, say): release still happens."""
    async with election(60) as e:
        server = e.server
        a = await e.leader("a")
        e.label_lease()
        a.scope.cancel()
        await wait_for(lambda: lease_holder(server, NS, NAME) is None)
        assert a.leases.calls["update"] >= 2  # the stale release, then the fresh one


async def test_announcer_tells_the_stream_and_systemd_once_per_change() -> None:
    from supervisor.events import EventBus, StatusChanged
    from supervisor.fanout.leadership import announcer

    bus = EventBus()
    lines: list[str] = []
    announce = announcer(bus, lines.append)
    with bus.subscribe() as sub:
        status = LeadershipStatus(role="standby", holder="vm-2", lease="ns/lease")
        announce(status)
        announce(status)  # no change: nothing new
        status.role, status.holder = "leader", "vm-1"
        announce(status)
        sub.close()
        events = [event async for event in sub.receive]
    assert [msgspec.to_builtins(e)["leadership"] for e in events] == [
        {"role": "standby", "holder": "vm-2", "lease": "ns/lease"},
        {"role": "leader", "holder": "vm-1", "lease": "ns/lease"},
    ]
    assert all(isinstance(e, StatusChanged) for e in events)
    assert lines == ["fan-out standby (leader: vm-2)", "fan-out leader (lease ns/lease)"]


async def test_an_outage_warns_once_then_says_when_it_is_over(
        autojump_clock: trio.testing.MockClock) -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        async with election(120) as e:
            a = await e.leader("a")
            a.leases.unreachable = True
            await trio.sleep(60)  # thirty retries
            a.leases.unreachable = False
            await wait_for(lambda: a.elector.leading)
    failed = [e for e in logs if e["event"] == "lease request failed"]
    assert [e["log_level"] for e in failed] == ["warning"]
    ended = [e for e in logs if e["event"] == "lease requests succeed again"]
    assert len(ended) == 1 and ended[0]["failures"] > 20  # every failure counted


@pytest.mark.parametrize("renew_time", ["10000-01-01T00:00:00Z", "", "2026-13-01T00:00:00Z"])
async def test_a_lease_with_an_unreadable_time_is_a_failure_naming_it_and_the_election_goes_on(
        autojump_clock: trio.testing.MockClock, renew_time: str) -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        async with election(300) as e:
            a = await e.leader("a")
            obj = e.server.store.find(LEASE, NS, NAME)
            assert obj is not None
            edited = {**obj, "spec": {**obj["spec"], "renewTime": renew_time}}
            e.server.store.replace(LEASE, NS, NAME, edited, "kubectl-edit")
            # Unreadable: no renewal succeeds, so a stops at its deadline; nothing crashes.
            await wait_for(lambda: not a.elector.leading)
            assert a.status.role == "standby" and e.writers.starts["a"] == 1
            e.server.delete("leases", NS, NAME)  # the operator's fix
            await wait_for(lambda: a.elector.leading)
            assert e.writers.starts["a"] == 2
    [failed] = [e for e in logs if e["event"] == "lease request failed"]
    assert failed["lease"] == f"{NS}/{NAME}" and "$.spec.renewTime" in failed["error"], failed


async def test_a_lease_client_go_wrote_in_another_offset_is_held_until_it_expires(
        autojump_clock: trio.testing.MockClock) -> None:
    # Another client's Lease: nanosecond fractions, a zone other than Z. Read as the
    # instant it names; b stands by for the lease duration, then takes it over.
    async with election(300) as e:
        a = await e.leader("a")
        a.scope.cancel()
        await wait_for(lambda: not a.elector.leading)
        obj = e.server.store.find(LEASE, NS, NAME)
        assert obj is not None
        other = {**obj, "spec": {**obj["spec"], "holderIdentity": "client-go",
                                 "leaseDurationSeconds": int(LEASE_S),
                                 "acquireTime": "2026-11-30T14:00:00.123456789+02:00",
                                 "renewTime": "2026-11-30T14:00:05.987654321-05:30"}}
        e.server.store.replace(LEASE, NS, NAME, other, "client-go")
        b, = e.start("b")
        await wait_for(lambda: b.status.holder == "client-go")
        seen = trio.current_time()
        await wait_for(lambda: b.elector.leading)
        assert trio.current_time() - seen >= LEASE_S - RETRY_S
        assert lease_holder(e.server, NS, NAME) == "b"
