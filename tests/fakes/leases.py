"""Lease support of the fake API server, for election tests.

The fake serves ``coordination.k8s.io/v1`` ``leases`` like any other resource
(:data:`LEASE` is in ``DEFAULT_RESOURCES``), with the store's real optimistic
concurrency: a PUT whose ``metadata.resourceVersion`` is stale is a 409
``Conflict``, a POST of an existing Lease a 409 ``AlreadyExists``.

:class:`StoreLeases` is :class:`~supervisor.kube.lease.LeaseApi` straight on a
:class:`~tests.fakes.apiserver.FakeApiServer`'s store, without HTTP, so
election unit tests run in virtual time (``autojump_clock``) against the very
same store and concurrency rules the HTTP fake serves. Each replica gets its
own instance, with its own faults: ``unreachable`` (every call raises
TransportError, as a partition), ``refuse_writes`` (every create/update gets a
500), ``latency_s`` (each call takes that long first; ``read_latency_s`` reads
only), ``hang`` (calls never
answer until cleared). ``calls`` counts calls by verb, ``answered`` the reads that returned.

:func:`lease_holder` reads the stored Lease's holder; :func:`refuse_lease_writes`
makes the HTTP fake refuse one replica's Lease writes (matched by the
``fieldManager`` the election sends: its identity).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from supervisor.kube.errors import TransportError, api_error
from supervisor.kube.lease import LeaseApi, LeaseRecord, lease_body, lease_record
from tests.fakes.apiserver import FakeApiServer, Injection
from tests.fakes.apiserver_store import DEFAULT_RESOURCES, ApiError, ResourceType

__all__ = ["LEASE", "StoreLeases", "lease_holder", "refuse_lease_writes"]

LEASE: ResourceType = next(res for res in DEFAULT_RESOURCES if res.plural == "leases")


class StoreLeases:
    def __init__(self, server: FakeApiServer, namespace: str, name: str,
                 manager: str = "election-test") -> None:
        self.server = server
        self.namespace = namespace
        self.name = name
        self.manager = manager
        self.unreachable = False
        self.refuse_writes = False
        self.latency_s = 0.0
        self.read_latency_s = 0.0  # reads only: the answer reflects the state at its end
        self.hang = False
        self.calls: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()  # calls that returned (not raised)
        self._unhung = trio.Event()

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def unhang(self) -> None:
        self.hang = False
        self._unhung.set()
        self._unhung = trio.Event()

    async def _enter(self, verb: str) -> None:
        self.calls[verb] += 1
        if self.latency_s:
            await trio.sleep(self.latency_s)
        if verb == "get" and self.read_latency_s:
            await trio.sleep(self.read_latency_s)
        while self.hang:
            await self._unhung.wait()
        if self.unreachable:
            raise TransportError(f"{verb} lease {self.where}: connection refused (fake)")
        if self.refuse_writes and verb != "get":
            raise api_error(500, "InternalError", "lease writes refused (fake)")
        await trio.lowlevel.checkpoint()

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ApiError as exc:
            raise api_error(exc.code, exc.reason, exc.message) from exc

    async def get(self) -> LeaseRecord | None:
        await self._enter("get")
        obj = self.server.store.find(LEASE, self.namespace, self.name)
        self.answered["get"] += 1
        return None if obj is None else self._record(obj)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        await self._enter("create")
        result = self._call(self.server.store.create, LEASE, self.namespace,
                            self._body(record, with_rv=False), self.manager)
        self.server._notify()
        return self._record(result.obj)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        await self._enter("update")
        result = self._call(self.server.store.replace, LEASE, self.namespace, self.name,
                            self._body(record, with_rv=True), self.manager)
        self.server._notify()
        return self._record(result.obj)

    def _body(self, record: LeaseRecord, *, with_rv: bool) -> dict[str, Any]:
        # The production encoding, so the store sees the very bodies KubeLeases sends.
        return lease_body(record, self.namespace, self.name, with_rv=with_rv)

    def _record(self, obj: dict[str, Any]) -> LeaseRecord:
        return lease_record(msgspec.json.encode(obj), self.where)


def lease_holder(server: FakeApiServer, namespace: str, name: str) -> str | None:
    obj = server.store.find(LEASE, namespace, name)
    return None if obj is None else ((obj.get("spec") or {}).get("holderIdentity") or None)


def refuse_lease_writes(server: FakeApiServer, identity: str) -> Injection:
    """The HTTP fake answers 500 to every Lease write carrying ``fieldManager=identity``."""
    return server.inject("*", r"/leases", status=500, times=None,
                         query_contains=f"fieldManager={identity}")


if TYPE_CHECKING:
    # mypy holds the fake to the Protocol (tests/unit/test_fakes_conform.py runs it).
    _conforms: type[LeaseApi] = StoreLeases
