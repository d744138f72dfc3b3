"""Kubernetes Events on our parents (core ``v1`` Event), as controllers record them."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

import trio

from supervisor.kube.client import KubeClient
from supervisor.kube.errors import KubeError, NotFound
from supervisor.kube.models import ObjectMeta, PartialObject, Resource, kube_time
from supervisor.logs import get_logger

__all__ = ["EVENTS", "EventRecorder"]

log = get_logger("kube.events")

EVENTS = Resource("", "v1", "events", "Event")
MAX_NAME = 253  # an object name (DNS subdomain), the Event's included
MERGE_PATCH = "application/merge-patch+json"

EventType = Literal["Normal", "Warning"]


class EventRecorder:
    """Records Events for one component; best effort, as client-go's recorder.

    It never fails the caller. A refused or failed write is logged at warning and dropped.
    It is logged once per reason and error text, so a missing RBAC rule does not flood the
    log.
    """

    def __init__(self, client: KubeClient, component: str, resource: Resource, namespace: str,
                 *, window_s: float = 60.0) -> None:
        self._client = client
        self._component = component
        self._resource = resource  # of the objects the Events are about, all in namespace
        self._namespace = namespace
        self._window_s = window_s
        # (name, uid, reason) -> the Event recorded last for it
        self._recent: dict[tuple[str, str, str], _Recorded] = {}
        self._warned: set[tuple[str, str]] = set()

    async def emit(self, about: ObjectMeta, type_: EventType, reason: str, message: str) -> None:
        """Record the Event now, or count it into the last like it.

        The Event is in the parent's namespace, ``involvedObject`` the parent (kind,
        apiVersion, namespace, name, uid, resourceVersion). ``reason`` is ``Applied``,
        ``ApplyFailed``, ``Invalid``, ``DriftRepaired`` or ``Conflict``; ``type`` is
        ``Normal`` or ``Warning``; the reporting component is the field manager. Its name is
        ``<parent name>.<16 hex digits>``, the parent's name cut to fit 253 characters.

        Aggregation, as client-go's correlator: the same reason on the same uid within
        ``window_s`` of the last is counted into it. The merge patch sets ``count`` + 1 and
        the latest ``lastTimestamp`` and ``message``. So a parent failing every retry
        records one ApplyFailed with a count. A patch that finds the Event expired creates a
        new one.
        """
        key = (about.name, about.uid, reason)
        now = trio.current_time()
        last = self._recent.get(key)
        if (last is not None and now - last.at < self._window_s
                and await self._count_into(about, last, message, now)):
            return
        if len(self._recent) > 4096:  # bounded: forget what is past the window
            self._recent = {k: r for k, r in self._recent.items()
                            if now - r.at < self._window_s}
        recorded = await self._create(about, type_, reason, message)
        if recorded is not None:
            recorded.at = now
            self._recent[key] = recorded

    async def _count_into(self, about: ObjectMeta, last: _Recorded, message: str,
                          now: float) -> bool:
        """Count a repeat into ``last``; False when it must be a new Event (it is gone)."""
        stamp = kube_time()
        patch = {"count": last.count + 1, "lastTimestamp": stamp, "message": message[:1024]}
        try:
            await self._client.request(
                "PATCH", EVENTS.object_path(self._namespace, last.name), PartialObject,
                body=patch, content_type=MERGE_PATCH)
        except NotFound:
            return False
        except KubeError as exc:
            self._failed(last.reason, about, exc)
            return True  # dropped, like any Event that cannot be written
        last.count += 1
        last.at = now
        return True

    def _failed(self, reason: str, about: ObjectMeta, exc: KubeError) -> None:
        warn_key = (reason, type(exc).__name__)
        if warn_key not in self._warned:
            self._warned.add(warn_key)
            log.warning("could not record a Kubernetes Event (RBAC for events in the"
                        " control namespace?); dropped", reason=reason, name=about.name,
                        namespace=self._namespace, error=str(exc))

    async def _create(self, about: ObjectMeta, type_: EventType, reason: str,
                      message: str) -> _Recorded | None:
        stamp = kube_time()
        name = f"{about.name[:MAX_NAME - 17]}.{secrets.token_hex(8)}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # Object names may be 253 characters, as may the Event's: the suffix
                # must not push it over (a long-named parent's Events were refused).
                "name": name,
                "namespace": self._namespace,
            },
            "involvedObject": {
                "apiVersion": self._resource.api_version,
                "kind": self._resource.kind,
                "namespace": self._namespace,
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
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "eventTime": None,
            "count": 1,
            "action": reason,
        }
        try:
            await self._client.request("POST", EVENTS.collection_path(self._namespace),
                                       PartialObject, body=body)
        except KubeError as exc:
            self._failed(reason, about, exc)
            return None
        return _Recorded(name, reason)


@dataclass
class _Recorded:
    """An Event we created, and how many times it has been counted."""

    name: str
    reason: str
    count: int = 1
    at: float = 0.0  # trio time of its last count
