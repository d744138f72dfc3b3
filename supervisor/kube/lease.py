"""The ``coordination.k8s.io/v1`` Lease calls leader election needs: get, create, update."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Protocol

import msgspec

from supervisor.kube.client import KubeClient, decode
from supervisor.kube.errors import DecodeError, NotFound
from supervisor.kube.models import PartialMeta, Resource

__all__ = [
    "LEASES",
    "BadLease",
    "KubeLeases",
    "LeaseApi",
    "LeaseRecord",
    "lease_body",
    "lease_record",
    "micro_time",
]

LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")


def micro_time(moment: datetime) -> str:
    """Kubernetes MicroTime: ``2026-11-30T12:00:00.123456Z`` (UTC, six fractional digits)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class BadLease(DecodeError):
    """An answer election cannot write back safely (not a Lease, no resourceVersion)."""


@dataclass(frozen=True)
class LeaseRecord:
    """What election reads and writes of a Lease.

    ``holder`` is ``spec.holderIdentity`` (None or empty: free); ``duration_s``
    ``leaseDurationSeconds``; ``acquire_time`` and ``renew_time`` MicroTime
    (:func:`micro_time`); ``transitions`` ``leaseTransitions``. ``resource_version`` and
    ``obj`` are the object as read.
    """
    holder: str | None = None
    duration_s: int | None = None
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0
    resource_version: str = ""
    # The Lease object as read (None for a record built here): what an update
    # sends back, with only the fields above replaced. Never mutated.
    obj: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


class LeaseApi(Protocol):
    """One Lease, by name: what leader election needs of the API server.

    The seam election is written against; tests drive it with a fake. :class:`KubeLeases`
    implements it. Failures are :mod:`~supervisor.kube.errors`; times that are not
    MicroTime are a DecodeError.
    """

    @property
    def where(self) -> str:
        """``namespace/name``, for reports and logs."""
        ...

    async def get(self) -> LeaseRecord | None: ...

    async def create(self, record: LeaseRecord) -> LeaseRecord: ...

    async def update(self, record: LeaseRecord) -> LeaseRecord: ...


#: RFC 3339 with its zone, read by msgspec (a zone-less time would not compare with now).
_MicroTime = Annotated[datetime, msgspec.Meta(tz=True)]


class _Spec(msgspec.Struct, rename="camel"):
    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: _MicroTime | None = None
    renew_time: _MicroTime | None = None
    lease_transitions: int | None = None


class _Lease(msgspec.Struct, rename="camel"):
    api_version: str = ""
    kind: str = ""
    metadata: PartialMeta = msgspec.field(default_factory=PartialMeta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


class KubeLeases:
    """:class:`LeaseApi` on a :class:`KubeClient`; ``manager`` names the writer (its identity).

    Writes carry ``fieldManager=<manager>``, so managedFields and audit name the replica.
    ``get`` answers None for a missing Lease. ``create`` of an existing one is a 409
    :class:`~supervisor.kube.errors.Conflict`. ``update`` is a PUT with the record's
    ``resourceVersion``: a concurrent writer makes it a Conflict, never an overwrite.
    A record without one raises :class:`BadLease` and sends nothing.
    """

    def __init__(self, client: KubeClient, namespace: str, name: str, manager: str) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.manager = manager[:128]

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def get(self) -> LeaseRecord | None:
        try:
            raw = await self.client.get(LEASES, self.namespace, self.name, msgspec.Raw)
        except NotFound:
            return None
        return lease_record(bytes(raw), self.where)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        return await self._write("POST", LEASES.collection_path(self.namespace), record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if not record.resource_version:
            raise BadLease(f"Lease {self.where}: refusing an update without a "
                           "resourceVersion (it would overwrite unconditionally)")
        return await self._write("PUT", LEASES.object_path(self.namespace, self.name), record)

    async def _write(self, method: str, path: str, record: LeaseRecord) -> LeaseRecord:
        body = lease_body(record, self.namespace, self.name, with_rv=method == "PUT")
        raw = await self.client.request(method, path, msgspec.Raw,
                                        params={"fieldManager": self.manager}, body=body)
        return lease_record(bytes(raw), self.where)


def lease_body(record: LeaseRecord, namespace: str, name: str, *, with_rv: bool) -> dict[str, Any]:
    """The Lease to send: ``record.obj`` (or a new Lease) with the election's fields replaced.

    Only ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``, ``renewTime``
    and ``leaseTransitions`` change, as client-go's LeaseLock does. Labels, annotations
    and unknown spec fields (1.31's ``strategy``/``preferredHolder``) go back unchanged;
    a PUT built from scratch would wipe them.
    """
    base = copy.deepcopy(dict(record.obj)) if record.obj is not None and with_rv else {}
    metadata: dict[str, Any] = dict(base.get("metadata") or {})
    # managedFields are the server's bookkeeping: omitted, the server keeps its own.
    metadata.pop("managedFields", None)
    metadata.update(name=name, namespace=namespace)
    if with_rv:
        metadata["resourceVersion"] = record.resource_version
    else:
        metadata.pop("resourceVersion", None)
    spec: dict[str, Any] = dict(base.get("spec") or {})
    spec.update(holderIdentity=record.holder or None, leaseDurationSeconds=record.duration_s,
                leaseTransitions=record.transitions)
    for key, moment in (("acquireTime", record.acquire_time), ("renewTime", record.renew_time)):
        if moment is not None:
            spec[key] = micro_time(moment)
        else:
            spec.pop(key, None)
    return {**base, "apiVersion": LEASES.api_version, "kind": LEASES.kind,
            "metadata": metadata, "spec": spec}


def lease_record(body: bytes, where: str) -> LeaseRecord:
    """The record of a Lease answer; :class:`BadLease` if it is not one a write can name.

    Not a ``coordination.k8s.io/v1`` Lease, or no ``metadata.resourceVersion``, is
    BadLease: without a resourceVersion no write can be conditional.
    """
    lease = decode(body, _Lease)
    if lease.kind != LEASES.kind or lease.api_version != LEASES.api_version:
        raise BadLease(f"Lease {where}: the answer is a {lease.api_version or '(no apiVersion)'} "
                       f"{lease.kind or '(no kind)'}, not a {LEASES.api_version} {LEASES.kind}")
    if not lease.metadata.resource_version:
        raise BadLease(f"Lease {where}: the answer has no metadata.resourceVersion")
    spec = lease.spec
    return LeaseRecord(
        holder=spec.holder_identity or None,
        duration_s=spec.lease_duration_seconds,
        acquire_time=spec.acquire_time,
        renew_time=spec.renew_time,
        transitions=spec.lease_transitions or 0,
        resource_version=lease.metadata.resource_version,
        obj=decode(body, dict[str, Any]),
    )
