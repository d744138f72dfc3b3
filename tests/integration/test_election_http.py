"""Leader election over real HTTP: the election's Lease client
(:class:`~supervisor.kube.lease.KubeLeases` on a
:class:`~supervisor.kube.client.KubeClient`) against the in-process fake API
server, next to a standby driven straight on the fake's store.

A hung token refresh does not keep a leader writing past its lease, renewals
keep the Lease's labels and annotations, a Lease without a resourceVersion is
never overwritten unconditionally, and the fake refuses an unconditional PUT as
kube-apiserver does.

Real time with short durations (lease 3 s, renew deadline 2 s, retry 0.5 s):
the HTTP fake cannot run under a virtual clock. The tests wait on events
(``on_change``), never on sleeps, and assert orderings, not durations.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Awaitable, Callable

import trio

from supervisor.fanout.leadership import LeaderElector, LeadershipStatus
from supervisor.kube.client import KubeClient
from supervisor.kube.config import KubeSettings
from supervisor.kube.lease import KubeLeases, LeaseApi
from tests.fakes.apiserver import FakeApiServer, run_fake_apiserver
from tests.fakes.leases import StoreLeases

NS, NAME = "trio-supervisor", "trio-supervisor-fanout"
LEASE_S, RENEW_S, RETRY_S = 3.0, 2.0, 0.5


class Writers:
    def __init__(self) -> None:
        self.active: set[str] = set()
        self.overlaps: list[frozenset[str]] = []

    def lead(self, name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            try:
                while True:
                    if self.active - {name}:
                        self.overlaps.append(frozenset(self.active | {name}))
                    self.active.add(name)
                    await trio.sleep(0.02)  # a leader's work tick: the Lease goes over real HTTP
            finally:
                self.active.discard(name)

        return run


class Watched:
    """A LeadershipStatus whose changes set events the test can wait on."""

    def __init__(self) -> None:
        self.status = LeadershipStatus()
        self.leading = trio.Event()
        self.saw: dict[str | None, trio.Event] = {}

    def changed(self, status: LeadershipStatus) -> None:
        if status.role == "leader":
            self.leading.set()
        self.saw.setdefault(status.holder, trio.Event()).set()

    async def wait_holder(self, holder: str) -> None:
        await self.saw.setdefault(holder, trio.Event()).wait()


def elector(leases: LeaseApi, identity: str, watched: Watched) -> LeaderElector:
    return LeaderElector(
        leases, identity=identity, lease_duration_s=LEASE_S,
        renew_deadline_s=RENEW_S, retry_period_s=RETRY_S, status=watched.status,
        on_change=watched.changed, rng=random.Random(identity))


def http_client(server: FakeApiServer, refresh: Callable[[], str | None] | None) -> KubeClient:
    async def settings() -> KubeSettings:
        return KubeSettings(host=server.url, source="election test", refresh=refresh)

    return KubeClient(settings, token_refresh_s=0.2)


async def test_a_hung_token_refresh_never_keeps_the_leader_writing_past_expiry() -> None:
    """The leader's credential refresh hangs (an exec plugin waiting on its cloud's
    identity service, an NFS-backed token file): KubeClient runs it in a worker thread
    that trio cannot abandon (client.py ``trio.to_thread.run_sync(settings.refresh)``,
    no ``abandon_on_cancel``), so neither the attempt's ``fail_after`` nor the renew
    deadline's ``move_on_at`` can end the renewal. The leader keeps fanning out while the
    standby, seeing no renewal for a lease duration, takes over: two fan-outs."""
    gate = threading.Event()
    hang = threading.Event()

    def refresh() -> str | None:
        if hang.is_set():
            gate.wait(60)
        return None

    writers = Writers()
    with trio.fail_after(30):
        async with run_fake_apiserver() as server:
            client = http_client(server, refresh)
            a, b = Watched(), Watched()
            try:
                async with trio.open_nursery() as nursery:
                    ea = elector(KubeLeases(client, NS, NAME, "a"), "a", a)
                    nursery.start_soon(ea.run, writers.lead("a"))
                    await a.leading.wait()
                    eb = elector(StoreLeases(server, NS, NAME, manager="b"), "b", b)
                    nursery.start_soon(eb.run, writers.lead("b"))
                    await b.wait_holder("a")
                    hang.set()
                    with trio.move_on_after(LEASE_S * 4):
                        await b.leading.wait()
                    a_still_leading = ea.leading
                    gate.set()
                    nursery.cancel_scope.cancel()
            finally:
                gate.set()
                await client.aclose()
    assert b.leading.is_set(), "the standby never took over (the test did not run its course)"
    assert not writers.overlaps and not a_still_leading, (
        "the standby took over while the old leader, stuck in a token refresh, still "
        f"led: {len(writers.overlaps)} overlapping writes")


async def test_renewals_keep_the_leases_labels_and_annotations() -> None:
    """The Lease carries labels and annotations someone else put there (the manifests, a
    GitOps tool, ``kubectl annotate``). Every election write is a PUT of a body built
    from scratch (lease.py ``KubeLeases._body``: name, namespace, resourceVersion and the
    spec only), so the first acquire wipes them, as the real API server does on a PUT
    (measured on kube-apiserver 1.20, /tmp/realkube: labels and annotations null after a
    PUT without them). client-go's LeaseLock updates the object it read, keeping its
    metadata (and spec fields it does not know, e.g. 1.31's ``strategy``)."""
    writers = Writers()
    with trio.fail_after(30):
        async with run_fake_apiserver() as server:
            server.create({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": NAME, "namespace": NS,
                             "labels": {"app.kubernetes.io/part-of": "trio-supervisor"},
                             "annotations": {"owner": "platform-team"}},
                "spec": {"leaseDurationSeconds": 15}}, field_manager="kubectl")
            client = http_client(server, None)
            a = Watched()
            try:
                async with trio.open_nursery() as nursery:
                    ea = elector(KubeLeases(client, NS, NAME, "a"), "a", a)
                    nursery.start_soon(ea.run, writers.lead("a"))
                    await a.leading.wait()
                    nursery.cancel_scope.cancel()
            finally:
                await client.aclose()
            lease = server.get("leases", NS, NAME)
    assert lease is not None
    assert lease["metadata"].get("labels") == {"app.kubernetes.io/part-of": "trio-supervisor"}
    assert lease["metadata"].get("annotations") == {"owner": "platform-team"}


async def test_a_lease_without_resource_version_is_never_overwritten_unconditionally() -> None:
    """A GET of the Lease answers 200 with a Lease that has no ``metadata.resourceVersion``
    (nor spec): a proxy in front of the API server, an aggregated/mock server. lease.py
    decodes it with every field defaulted (``_Meta.resource_version = ""``, ``_Spec`` all
    None), so b sees a free Lease and PUTs it with ``resourceVersion: ""``: a write
    without the optimistic-concurrency precondition the issue requires.

    Measured on kube-apiserver 1.20 (/tmp/realkube): such a PUT on a Lease is a 422
    ("metadata.resourceVersion: must be specified for an update"), so there b only
    fails; the fake accepts it as an unconditional update (see the next test), so here
    b steals the Lease from a leader that renewed moments ago and both fan out.
    Expected: a Lease without a resourceVersion is a DecodeError, and
    ``KubeLeases.update`` never sends a PUT without one."""
    writers = Writers()
    with trio.fail_after(30):
        async with run_fake_apiserver() as server:
            client = http_client(server, None)
            a, b = Watched(), Watched()
            try:
                async with trio.open_nursery() as nursery:
                    ea = elector(StoreLeases(server, NS, NAME, manager="a"), "a", a)
                    nursery.start_soon(ea.run, writers.lead("a"))
                    await a.leading.wait()
                    server.inject("GET", rf"/leases/{NAME}$", status=200, times=None, body={
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": NAME, "namespace": NS}})
                    eb = elector(KubeLeases(client, NS, NAME, "b"), "b", b)
                    nursery.start_soon(eb.run, writers.lead("b"))
                    with trio.move_on_after(LEASE_S * 2):
                        await b.leading.wait()
                    nursery.cancel_scope.cancel()
            finally:
                await client.aclose()
            puts = [r for r in server.requests if r.method == "PUT" and r.field_manager == "b"]
    unconditional = [r for r in puts
                     if not ((r.body or {}).get("metadata") or {}).get("resourceVersion")]
    assert not writers.overlaps and not unconditional, (
        f"two fan-outs at once ({len(writers.overlaps)} overlapping writes); "
        f"{len(unconditional)} Lease PUTs without a resourceVersion")


async def test_the_fake_refuses_an_unconditional_lease_put_as_kube_apiserver_does(
) -> None:
    """The fake's Lease objects have real optimistic concurrency. A PUT of a Lease whose
    ``metadata.resourceVersion`` is empty or absent is refused by kube-apiserver 1.20 with
    422 Invalid (leases do not allow unconditional updates; measured on a real server),
    and the fake's ``_precondition`` (apiserver_store.py) refuses it the same way."""
    from tests.fakes.apiserver_store import ApiError
    from tests.fakes.leases import LEASE

    server = FakeApiServer()
    server.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": NAME, "namespace": NS},
                   "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})
    unconditional = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": NAME, "namespace": NS, "resourceVersion": ""},
                     "spec": {"holderIdentity": "b", "leaseDurationSeconds": 15}}
    code = None
    try:
        server.store.replace(LEASE, NS, NAME, unconditional, "b")
    except ApiError as exc:
        code = exc.code
    lease = server.get("leases", NS, NAME)
    assert lease is not None
    assert code == 422 and lease["spec"]["holderIdentity"] == "a", (
        f"the fake answered {code or 200} and the holder is now "
        f"{lease['spec']['holderIdentity']!r}")
