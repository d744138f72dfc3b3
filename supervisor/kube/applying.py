"""Server-side apply of desired objects, and knowing when not to write at all.

Contract:

- A :class:`Desired` object is the complete apply configuration we own
  (apiVersion, kind, metadata with labels, spec). Its :attr:`Desired.digest`
  is a SHA-256 over that configuration in canonical (sorted-key) JSON, and is
  stamped on the object as the annotation :data:`DIGEST_ANNOTATION`.
- Writes go as server-side apply (``PATCH``, ``application/apply-patch+yaml``
  with a JSON body, ``fieldManager``, ``force=true``): we own our fields and
  take them back from anyone who edited them, without read-modify-write races.
- Skipping unchanged writes: a reconciler remembers, per child, the digest it
  last applied or observed (the annotation read back from a list of the
  children). Equal digest, no request. The annotation makes this survive a
  restart: the first resync after boot reads the digests of the existing
  children and writes nothing for those already up to date.
- Known limitation: an edit by someone else that leaves our annotation alone
  is not seen until the desired object changes (we do not compare the live
  spec, which carries server defaults).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from supervisor.kube.client import KubeClient
from supervisor.kube.models import PartialObject, Resource

__all__ = ["DIGEST_ANNOTATION", "ChildKey", "Desired", "apply_desired", "digest_of", "make_desired"]

DIGEST_ANNOTATION = "platform.trio-supervisor.dev/applied-digest"


@dataclass(frozen=True, order=True)
class ChildKey:
    """A child object: which resource, what name (the namespace is the reconciler's)."""

    plural: str
    name: str


@dataclass(frozen=True)
class Desired:
    """One object as we want it; ``body`` already carries the digest annotation."""

    resource: Resource
    name: str
    body: Mapping[str, Any] = field(repr=False)
    digest: str

    @property
    def key(self) -> ChildKey:
        return ChildKey(self.resource.plural, self.name)


def _digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(msgspec.json.encode(body, order="sorted")).hexdigest()[:32]


def make_desired(
    resource: Resource,
    namespace: str,
    name: str,
    *,
    labels: Mapping[str, str],
    spec: Mapping[str, Any],
) -> Desired:
    """Build the apply configuration of one object and stamp its digest."""
    body: dict[str, Any] = {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }
    digest = _digest(body)
    body["metadata"]["annotations"] = {DIGEST_ANNOTATION: digest}
    return Desired(resource, name, body, digest)


def digest_of(obj: PartialObject) -> str | None:
    """The digest we stamped on an observed object, if any."""
    return obj.metadata.annotations.get(DIGEST_ANNOTATION)


async def apply_desired(
    client: KubeClient, namespace: str, desired: Desired, *, field_manager: str
) -> PartialObject:
    """One server-side apply of ``desired`` (force: we own these fields)."""
    return await client.apply(
        desired.resource, namespace, desired.name, desired.body,
        field_manager=field_manager, force=True,
    )
