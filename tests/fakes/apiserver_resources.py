"""What the fake Kubernetes API server serves: the resource type and the object type.

A :class:`ResourceType` is one row of the real server's discovery document
(``/api/v1``, ``/apis/{group}/{version}``): group, version, plural, kind, whether it is
namespaced, whether it comes from a CRD. ``Obj`` is a decoded JSON object, as every module
of the fake passes objects around. The default table of resources is
``DEFAULT_RESOURCES`` in :mod:`tests.fakes.apiserver_store`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    """One API resource (a row of the server's discovery document)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    crd: bool = False
    has_generation: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """``deployments.apps`` / ``services``: how error messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


__all__ = ["Obj", "ResourceType"]
