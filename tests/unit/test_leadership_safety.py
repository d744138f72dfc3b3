"""The fan-out's leader election never lets two replicas fan out at once, on virtual time.

A crashed fan-out is not reported as leading; a fractional lease duration is
rounded below the renew deadline; a Lease deleted or edited to name the standby
while leading, two replicas configured with the same identity, and a SIGTERM
while an acquiring write is in flight each keep one writer.

Virtual time (``autojump_clock``) against the fake API server's Lease store
(:class:`~tests.fakes.leases.StoreLeases`), as tests/unit/test_leadership.py
does. Each elector runs a stand-in for the fan-out that "writes" every 50 ms
while it runs; ``Writers.overlaps`` records every moment two replicas wrote
at once, which is the safety property ("never two fan-outs").
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import trio
import trio.testing

from supervisor.fanout.leadership import LeaderElector, LeadershipMetrics, LeadershipStatus
from supervisor.kube.lease import LeaseRecord
from supervisor.telemetry import Metrics
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.leases import LEASE, StoreLeases, lease_holder

NS, NAME = "trio-supervisor", "trio-supervisor-fanout"


class Writers:
    """Stand-ins for the fan-out: who is writing now, and every overlap seen."""

    def __init__(self) -> None:
        self.active: set[str] = set()
        self.overlaps: list[tuple[float, frozenset[str]]] = []
        self.starts: dict[str, int] = {}

    def lead(self, name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            self.starts[name] = self.starts.get(name, 0) + 1
            try:
                while True:
                    if self.active - {name}:
                        self.overlaps.append((trio.current_time(),
                                              frozenset(self.active | {name})))
                    self.active.add(name)
                    await trio.sleep(0.05)
            finally:
                self.active.discard(name)

        return run


class Replica:
    def __init__(self, server: FakeApiServer, name: str, *, identity: str | None = None,
                 lease_s: float = 15.0, renew_s: float = 10.0, retry_s: float = 2.0,
                 lead: Callable[[], Awaitable[None]] | None = None,
                 writers: Writers | None = None) -> None:
        self.name = name
        self.leases = StoreLeases(server, NS, NAME, manager=name)
        self.status = LeadershipStatus()
        self.metrics = LeadershipMetrics(Metrics(process=False).registry)
        self.elector = LeaderElector(
            self.leases, identity=identity or name, lease_duration_s=lease_s,
            renew_deadline_s=renew_s, retry_period_s=retry_s, status=self.status,
            metrics=self.metrics, rng=random.Random(name))
        assert lead is not None or writers is not None
        self.lead = lead if lead is not None else writers.lead(name)  # type: ignore[union-attr]
        self.scope = trio.CancelScope()
        self.error: BaseException | None = None

    async def run(self) -> None:
        with self.scope:
            try:
                await self.elector.run(self.lead)
            except Exception as exc:  # noqa: BLE001 - recorded for the test to inspect
                self.error = exc


async def wait_for(predicate: Callable[[], bool], step: float = 0.01) -> None:
    while not predicate():
        await trio.sleep(step)


async def test_a_crashed_fanout_is_not_reported_as_leading(
        autojump_clock: trio.testing.MockClock) -> None:
    """The fan-out group crashes while leading: the elector releases the Lease and raises
    (the tree restarts the child after a backoff of up to 30 s). Until then this replica
    does not lead, yet /status says ``role = "leader"`` and ``supervisor_leader`` stays 1,
    so two replicas can report leader at once and the NoFanoutLeader alert stays quiet
    through a crash loop."""
    server = FakeApiServer()

    async def crashing_fanout() -> None:
        await trio.sleep(5)
        raise RuntimeError("a fan-out bug")

    a = Replica(server, "a", lead=crashing_fanout)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.run)
            await wait_for(lambda: a.error is not None)
    assert isinstance(a.error, BaseException)
    assert lease_holder(server, NS, NAME) is None  # released on the way out: correct
    assert not a.elector.leading
    # The defect: the report and the gauge still say leader.
    assert a.status.role == "standby", f"/status role after the crash: {a.status.role}"
    assert a.metrics.leader._value.get() == 0.0
    assert a.metrics.transitions.labels("standby")._value.get() == 1.0


async def test_fractional_lease_duration_is_rounded_below_the_renew_deadline(
        autojump_clock: trio.testing.MockClock) -> None:
    """A configuration the loader accepts (``lease_duration_s = 4.5``, ``renew_deadline_s =
    4.4``, ``retry_period_s = 0.1``): the elector writes ``leaseDurationSeconds =
    round(4.5) = 4`` but keeps leading for 4.4 s after its last renewal started. The others
    expire the Lease after the 4 s they read, so after a partition of the leader two
    replicas write at once for about 0.3 s."""
    server, writers = FakeApiServer(), Writers()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            a = Replica(server, "a", lease_s=4.5, renew_s=4.4, retry_s=0.1, writers=writers)
            nursery.start_soon(a.run)
            await wait_for(lambda: a.elector.leading)
            b = Replica(server, "b", lease_s=4.5, renew_s=4.4, retry_s=0.1, writers=writers)
            nursery.start_soon(b.run)
            await trio.sleep(3.03)
            obj = server.store.find(LEASE, NS, NAME)
            assert obj is not None
            written = obj["spec"]["leaseDurationSeconds"]
            a.leases.unreachable = True  # a partition of the leader
            await wait_for(lambda: b.elector.leading)
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
    assert not writers.overlaps, (
        f"two fan-outs at once from {writers.overlaps[0][0]:.2f} to "
        f"{writers.overlaps[-1][0]:.2f} (virtual s); leaseDurationSeconds written: {written}")
    assert written >= 4.5, f"leaseDurationSeconds written: {written} < lease_duration_s 4.5"


async def test_a_lease_deleted_while_leading_never_makes_two_leaders(
        autojump_clock: trio.testing.MockClock) -> None:
    """An operator deletes the Lease (``kubectl delete lease``) while a leads. b's next
    poll finds no Lease and creates it at once, although it saw a renew it moments ago:
    b starts fanning out while a keeps leading until its own next renewal notices."""
    server, writers = FakeApiServer(), Writers()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            a = Replica(server, "a", writers=writers)
            nursery.start_soon(a.run)
            await wait_for(lambda: a.elector.leading)
            b = Replica(server, "b", writers=writers)
            nursery.start_soon(b.run)
            await wait_for(lambda: b.status.holder == "a")
            await trio.sleep(10.5)
            server.store.delete(LEASE, NS, NAME)
            await trio.sleep(30)
            nursery.cancel_scope.cancel()
    assert not writers.overlaps, (
        f"two fan-outs at once after the Lease was deleted: from "
        f"{writers.overlaps[0][0]:.2f} to {writers.overlaps[-1][0]:.2f} (virtual s)")


async def test_two_replicas_configured_with_the_same_identity_never_both_fan_out(
        autojump_clock: trio.testing.MockClock) -> None:
    """``[kubernetes].identity`` copied to two VMs (the same config file): the second
    replica reads a Lease naming "its" identity, takes it as its own and leads at once,
    and both keep renewing. Nothing refuses, detects or even logs the collision."""
    from structlog.testing import capture_logs

    server, writers = FakeApiServer(), Writers()
    with trio.fail_after(120), capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            a = Replica(server, "vm-a", identity="supervisor", writers=writers)
            nursery.start_soon(a.run)
            await wait_for(lambda: a.elector.leading)
            b = Replica(server, "vm-b", identity="supervisor", writers=writers)
            nursery.start_soon(b.run)
            await trio.sleep(60)
            nursery.cancel_scope.cancel()
    both = sorted(t for t, who in writers.overlaps if who == {"vm-a", "vm-b"})
    warned = [e for e in logs if e.get("log_level") in ("warning", "error")
              and "identity" in str(e.get("event", ""))]
    assert not both or warned, (
        f"two replicas with one identity both fanned out from {both[0]:.1f} to "
        f"{both[-1]:.1f} (virtual s), and nothing was logged about it")
    assert not both, "two fan-outs at once with a shared identity"


async def test_a_lease_edited_to_name_the_standby_never_makes_two_leaders(
        autojump_clock: trio.testing.MockClock) -> None:
    """Unique identities, but the Lease is written by someone else to name b: an operator
    "moving" leadership with ``kubectl edit lease``, or a restore of etcd or of a backup
    (Velero) taken while b held it. b's next poll sees its own identity, takes the record
    as its own (``ours = current.holder == self.identity``) and leads at once, although it
    never wrote that record; a keeps leading until its next renewal notices. Same root
    cause as a shared identity: a record naming us is trusted without having been
    written by this elector."""
    server, writers = FakeApiServer(), Writers()
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            a = Replica(server, "a", writers=writers)
            nursery.start_soon(a.run)
            await wait_for(lambda: a.elector.leading)
            b = Replica(server, "b", writers=writers)
            nursery.start_soon(b.run)
            await wait_for(lambda: b.status.holder == "a")

            async def hand_over(leader: Replica, other: Replica) -> None:
                renewed = leader.leases.calls["update"]
                await wait_for(lambda: leader.leases.calls["update"] > renewed)
                obj = server.store.find(LEASE, NS, NAME)
                assert obj is not None
                edited = {**obj, "spec": {**obj["spec"], "holderIdentity": other.name}}
                server.store.replace(LEASE, NS, NAME, edited, "kubectl-edit")
                await wait_for(lambda: other.elector.leading and not leader.elector.leading)
                await trio.sleep(20)

            for _ in range(5):
                await (hand_over(a, b) if a.elector.leading else hand_over(b, a))
            nursery.cancel_scope.cancel()
    assert not writers.overlaps, (
        f"two fan-outs at once after the Lease was edited to name the standby: "
        f"{len({round(t, 1) for t, _ in writers.overlaps})} tenths of a second in total")


class SlowAnswers(StoreLeases):
    """The write lands on the server at once; its answer takes ``answer_s`` to come back."""

    answer_s = 0.0

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        result = await super().update(record)
        await trio.sleep(self.answer_s)
        return result


async def test_sigterm_while_an_acquiring_write_is_in_flight_keeps_the_lease(
        autojump_clock: trio.testing.MockClock) -> None:
    """SIGTERM arrives while a's acquiring PUT has landed but its answer has not come
    back (a slow API server). ``run``'s ``finally`` releases only when ``_observed`` names
    us, and ``_observed`` is still the free record read before the PUT, so nothing is
    released: the Lease names a for a whole lease duration and b takes over after 15 s
    instead of within its retry period (the handover the issue asks of a SIGTERM)."""
    server, writers = FakeApiServer(), Writers()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            b = Replica(server, "b", writers=writers)
            nursery.start_soon(b.run)
            await wait_for(lambda: b.elector.leading)
            b.scope.cancel()  # b stops cleanly: the Lease is free, a may take it
            await wait_for(lambda: lease_holder(server, NS, NAME) is None)
            a = Replica(server, "a", writers=writers)
            slow = SlowAnswers(server, NS, NAME, manager="a")
            slow.answer_s = 3.0
            a.elector.leases = a.leases = slow
            nursery.start_soon(a.run)
            await wait_for(lambda: lease_holder(server, NS, NAME) == "a")
            a.scope.cancel()  # SIGTERM: the PUT has landed, its answer is on its way
            stopped = trio.current_time()
            c = Replica(server, "c", writers=writers)
            nursery.start_soon(c.run)
            await wait_for(lambda: c.elector.leading)
            took = trio.current_time() - stopped
            nursery.cancel_scope.cancel()
    assert took <= 2.0 + 0.1, (
        f"the standby took over {took:.1f} s after the SIGTERM (retry period 2 s): the "
        f"Lease was left naming the stopped replica")
