"""The ``coordination.k8s.io/v1`` Lease calls leader election needs: get, create, update.

Contract:

- :class:`LeaseRecord` is what election reads and writes: ``holder``
  (``spec.holderIdentity``; None or empty = free), ``duration_s``
  (``leaseDurationSeconds``), ``acquire_time``/``renew_time`` (MicroTime:
  RFC 3339 with microseconds, always UTC, :func:`micro_time`), ``transitions``
  (``leaseTransitions``) and the object's ``resource_version``.
- :class:`LeaseApi` is the seam election is written against (tests drive it
  with a fake of their own); :class:`KubeLeases` is the implementation on a
  :class:`~supervisor.kube.client.KubeClient`.
- ``update`` is a PUT carrying the record's ``resourceVersion``: a concurrent
  writer makes it fail with :class:`~supervisor.kube.errors.Conflict` (409),
  never overwrite. ``create`` of an existing Lease is a ``Conflict`` too
  (409 AlreadyExists). ``get`` answers None for a missing Lease.
- Writes carry ``fieldManager=<holder identity>`` so the server's
  managedFields (and audit) say which replica wrote.
- Failures are the client's :mod:`~supervisor.kube.errors`; a Lease whose
  times are not MicroTime is a :class:`~supervisor.kube.errors.DecodeError`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec

from supervisor.kube.client import KubeClient
from supervisor.kube.errors import DecodeError, NotFound
from supervisor.kube.models import Resource

__all__ = [
    "LEASES",
    "KubeLeases",
    "LeaseApi",
    "LeaseRecord",
    "micro_time",
    "parse_micro_time",
]

LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")


def micro_time(moment: datetime) -> str:
    """Kubernetes MicroTime: ``2026-11-30T12:00:00.123456Z`` (UTC, six fractional digits)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str | None) -> datetime | None:
    """A MicroTime (or any RFC 3339 time) as an aware datetime; None for None or empty."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise DecodeError(f"Lease time {text!r} is not RFC 3339") from exc
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None = None
    duration_s: int | None = None
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0
    resource_version: str = ""

    def but(self, **changes: Any) -> LeaseRecord:
        return replace(self, **changes)


class LeaseApi(Protocol):
    """One Lease, by name: what leader election needs of the API server."""

    @property
    def where(self) -> str:
        """``namespace/name``, for reports and logs."""
        ...

    async def get(self) -> LeaseRecord | None: ...

    async def create(self, record: LeaseRecord) -> LeaseRecord: ...

    async def update(self, record: LeaseRecord) -> LeaseRecord: ...


class _Meta(msgspec.Struct, rename="camel"):
    name: str = ""
    resource_version: str = ""


class _Spec(msgspec.Struct, rename="camel"):
    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int | None = None


class _Lease(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


class KubeLeases:
    """:class:`LeaseApi` on a :class:`KubeClient`; ``manager`` names the writer (its identity)."""

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
            lease = await self.client.get(LEASES, self.namespace, self.name, _Lease)
        except NotFound:
            return None
        return _record(lease)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        lease = await self.client.request(
            "POST", LEASES.collection_path(self.namespace), _Lease,
            params={"fieldManager": self.manager}, body=self._body(record, with_rv=False))
        return _record(lease)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        lease = await self.client.request(
            "PUT", LEASES.object_path(self.namespace, self.name), _Lease,
            params={"fieldManager": self.manager}, body=self._body(record, with_rv=True))
        return _record(lease)

    def _body(self, record: LeaseRecord, *, with_rv: bool) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if with_rv:
            metadata["resourceVersion"] = record.resource_version
        spec: dict[str, Any] = {
            "holderIdentity": record.holder or None,
            "leaseDurationSeconds": record.duration_s,
            "leaseTransitions": record.transitions,
        }
        if record.acquire_time is not None:
            spec["acquireTime"] = micro_time(record.acquire_time)
        if record.renew_time is not None:
            spec["renewTime"] = micro_time(record.renew_time)
        return {"apiVersion": LEASES.api_version, "kind": LEASES.kind,
                "metadata": metadata, "spec": spec}


def _record(lease: _Lease) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(
        holder=spec.holder_identity or None,
        duration_s=spec.lease_duration_seconds,
        acquire_time=parse_micro_time(spec.acquire_time),
        renew_time=parse_micro_time(spec.renew_time),
        transitions=spec.lease_transitions or 0,
        resource_version=lease.metadata.resource_version,
    )
