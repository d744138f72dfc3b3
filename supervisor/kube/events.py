"""Kubernetes Events on our parents (core ``v1`` Event), as controllers record them.

Contract of :class:`EventRecorder`:

- :meth:`EventRecorder.emit` creates one Event in the parent's namespace whose
  ``involvedObject`` is the parent (kind, apiVersion, namespace, name, uid,
  resourceVersion), with ``reason`` (``Applied``, ``ApplyFailed``,
  ``Invalid``, ``DriftRepaired``), ``type`` ``Normal`` or ``Warning``, and the
  reporting component (the field manager).
- The Event is named ``<parent name>.<16 hex digits>``, the parent's name cut
  so the whole stays within the 253 characters an object name may have.
- Never fails the caller: Events are best effort, as client-go's recorder.
  A refused or failed write is logged at warning (once per reason and
  error text, so a missing RBAC rule does not flood the log) and dropped.
- Spam filter: the same (object, reason, message) within ``dedupe_s`` is
  emitted once, so a parent failing every retry records one ApplyFailed, not
  one per attempt.
"""

from __future__ import annotations

import datetime as _dt
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import trio

from supervisor.kube.errors import KubeError
from supervisor.kube.models import PartialObject, Resource
from supervisor.logs import get_logger

__all__ = ["EVENTS", "EventRecorder", "EventSink", "Involved"]

log = get_logger("kube.events")

EVENTS = Resource("", "v1", "events", "Event")
MAX_NAME = 253  # an object name (DNS subdomain), the Event's included

T = TypeVar("T")

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Involved:
    """The object an Event is about."""

    resource: Resource
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""


class EventSink(Protocol):
    """The one client call an :class:`EventRecorder` makes (``KubeClient`` satisfies it)."""

    async def request(self, method: str, path: str, type_: type[T], *,
                      params: Mapping[str, str] | None = None, body: Any = None,
                      content_type: str = ...) -> T: ...


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventRecorder:
    """Records Events for one component (see the module doc)."""

    def __init__(self, client: EventSink, component: str, *, dedupe_s: float = 60.0) -> None:
        self._client = client
        self._component = component
        self._dedupe_s = dedupe_s
        self._recent: dict[tuple[str, str, str, str], float] = {}
        self._warned: set[tuple[str, str]] = set()
        self.emitted = 0
        self.failed = 0

    async def emit(self, about: Involved, type_: EventType, reason: str, message: str) -> None:
        """Create the Event now (best effort; see the module doc)."""
        key = (about.namespace, about.name, reason, message)
        now = trio.current_time()
        last = self._recent.get(key)
        if last is not None and now - last < self._dedupe_s:
            return
        if len(self._recent) > 4096:  # bounded: forget what is past the window
            self._recent = {k: t for k, t in self._recent.items() if now - t < self._dedupe_s}
        self._recent[key] = now
        stamp = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # Object names may be 253 characters, as may the Event's: the suffix
                # must not push it over (a long-named parent's Events were refused).
                "name": f"{about.name[:MAX_NAME - 17]}.{secrets.token_hex(8)}",
                "namespace": about.namespace,
            },
            "involvedObject": {
                "apiVersion": about.resource.api_version,
                "kind": about.resource.kind,
                "namespace": about.namespace,
                "name": about.name,
                "uid": about.uid or None,
                "resourceVersion": about.resource_version or None,
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._component,
            "firstTimestamp": stamp[:19] + "Z",
            "lastTimestamp": stamp[:19] + "Z",
            "eventTime": None,
            "count": 1,
            "action": reason,
        }
        try:
            await self._client.request("POST", EVENTS.collection_path(about.namespace),
                                       PartialObject, body=body)
        except KubeError as exc:
            self.failed += 1
            warn_key = (reason, type(exc).__name__)
            if warn_key not in self._warned:
                self._warned.add(warn_key)
                log.warning("could not record a Kubernetes Event (RBAC for events in the"
                            " control namespace?); dropped", reason=reason, name=about.name,
                            namespace=about.namespace, error=str(exc))
            return
        self.emitted += 1
