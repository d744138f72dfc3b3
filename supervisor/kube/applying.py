"""Server-side apply of desired objects: the apply configuration and its digest.

Children are written by :mod:`supervisor.fanout.childwrites` (created when absent,
applied without ``force`` to what is ours: :mod:`supervisor.fanout.ownership`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from supervisor.kube.models import Resource

__all__ = ["DIGEST_ANNOTATION", "ChildKey", "Desired", "make_desired"]

DIGEST_ANNOTATION = "platform.trio-supervisor.dev/applied-digest"


@dataclass(frozen=True, order=True)
class ChildKey:
    """A child object: which resource, what name (the namespace is the reconciler's)."""

    plural: str
    name: str


@dataclass(frozen=True)
class Desired:
    """One object as we want it; ``body`` already carries the digest annotation.

    ``body`` is the complete apply configuration we own (apiVersion, kind, metadata
    with labels, spec). :attr:`digest` is a SHA-256 of it in canonical (sorted-key)
    JSON, stamped as :data:`DIGEST_ANNOTATION`.

    The reconciler skips a write only when the live child covers ``body``
    (:func:`supervisor.fanout.live.covers`: every field we set has our value; server
    defaults do not count). So someone else's edit is seen and repaired, annotation
    untouched or not. The digest tells such drift (the live child carries the digest we
    still want) from a desired change (it carries an older one).
    """

    resource: Resource
    name: str
    body: Mapping[str, Any] = field(repr=False)
    digest: str

    @property
    def key(self) -> ChildKey:
        return ChildKey(self.resource.plural, self.name)


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
    digest = hashlib.sha256(msgspec.json.encode(body, order="sorted")).hexdigest()[:32]
    body["metadata"]["annotations"] = {DIGEST_ANNOTATION: digest}
    return Desired(resource, name, body, digest)
