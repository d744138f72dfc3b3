"""Watch streams of the fake Kubernetes API server.

Follows kube-apiserver's watch: chunked newline-delimited JSON events after
``resourceVersion`` (none or ``0``: synthetic ADDED events for the current state first);
selectors applied per event (an object leaving the selector is sent as DELETED, entering
as ADDED); ``timeoutSeconds`` ends the stream cleanly; ``allowWatchBookmarks`` gives
BOOKMARK events; an RV older than the history window is one ``ERROR`` event with a 410
``Expired`` Status; an RV newer than the server's waits ``too_large_rv_wait_s`` (the watch
cache waits 3 s), then is one ``ERROR`` event with a 504 ``Timeout`` Status (cause
``ResourceVersionTooLarge``); both end the stream.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import trio

from tests.fakes.apiserver_errors import ApiError, too_large_resource_version
from tests.fakes.apiserver_http import Receive, Send, json_bytes, truthy, wait_disconnect
from tests.fakes.apiserver_requests import RecordedRequest
from tests.fakes.apiserver_resources import Obj, ResourceType
from tests.fakes.apiserver_selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from tests.fakes.apiserver_store import Store, WatchEvent


class Watcher:
    """One open watch stream: what it selects and the lines queued for it."""

    def __init__(self, res: ResourceType, namespace: str | None, labels: Any, fields: Any,
                 bookmarks: bool) -> None:
        self.res = res
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.bookmarks = bookmarks
        self.queue: deque[bytes] = deque()
        self.wake = trio.Event()
        self.closed = False
        self.end_when_drained = False
        self.sent = 0

    def _match(self, obj: Obj | None) -> bool:
        return obj is not None and labels_match(self.labels, obj) and fields_match(
            self.fields, obj)

    def classify(self, ev: WatchEvent) -> str | None:
        if ev.plural != self.res.plural:
            return None
        if self.namespace is not None and self.res.namespaced and ev.namespace != self.namespace:
            return None
        if ev.type == "ADDED":
            return "ADDED" if self._match(ev.obj) else None
        if ev.type == "DELETED":
            return "DELETED" if self._match(ev.obj) else None
        was, now = self._match(ev.old), self._match(ev.obj)
        if was and now:
            return "MODIFIED"
        if now:
            return "ADDED"
        if was:
            return "DELETED"
        return None

    def push_line(self, line: bytes) -> None:
        self.queue.append(line)
        self.wake.set()

    def push(self, kind: str, obj: Obj) -> None:
        self.push_line(event_line(kind, obj))


def event_line(kind: str, obj: Obj) -> bytes:
    return json_bytes({"type": kind, "object": obj}) + b"\n"


class WatchStreams:
    """The watch side of :class:`~tests.fakes.apiserver.FakeApiServer`."""

    store: Store
    bookmark_interval_s: float
    too_large_rv_wait_s: float
    _watchers: set[Watcher]
    _stalled: bool
    _notify: Callable[[], None]

    def _on_event(self, ev: WatchEvent) -> None:
        for w in list(self._watchers):
            kind = w.classify(ev)
            if kind is not None:
                w.push(kind, ev.obj)
        self._notify()

    async def wait_for_watches(self, n: int = 1, plural: str | None = None) -> None:
        """Wait until at least ``n`` watch streams (of ``plural``) are open."""
        await self.wait_until(lambda: self.open_watches(plural) >= n)

    def open_watches(self, plural: str | None = None) -> int:
        return sum(1 for w in self._watchers if plural in (None, w.res.plural))

    async def _watch(self, res: ResourceType, ns: str | None, name: str | None,
                     query: Mapping[str, str], rec: RecordedRequest, receive: Receive,
                     send: Send) -> None:
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"))
        if name is not None:
            fields = (*fields, ("metadata.name", "=", name))
        timeout = None
        if query.get("timeoutSeconds"):
            try:
                timeout = float(query["timeoutSeconds"])
            except ValueError as exc:
                raise ApiError(400, "BadRequest", "invalid timeoutSeconds") from exc
        rv_param = query.get("resourceVersion") or ""
        try:
            since = int(rv_param) if rv_param not in ("", "0") else None
        except ValueError as exc:
            raise ApiError(400, "BadRequest",
                           f"invalid resource version: {rv_param!r}") from exc
        too_large = since is not None and not await self._reached(since)
        w = Watcher(res, ns, labels, fields, truthy(query.get("allowWatchBookmarks")))
        # Backlog and registration happen without an await: no event can fall in between.
        if too_large:
            assert since is not None
            w.push("ERROR", too_large_resource_version(since, self.store.rv).status())
            w.end_when_drained = True
        elif since is None:
            for key in sorted(self.store.objects[res.plural]):
                obj = self.store.objects[res.plural][key]
                if (ns is None or not res.namespaced or key[0] == ns) and w._match(obj):
                    w.push("ADDED", obj)
        else:
            try:
                backlog = self.store.history_since(since)
            except ApiError as err:
                w.push("ERROR", err.status())
                w.end_when_drained = True
                backlog = []
            for ev in backlog:
                kind = w.classify(ev)
                if kind is not None:
                    w.push(kind, ev.obj)
        self._watchers.add(w)
        self._notify()
        rec.status = 200
        disconnected = False
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"cache-control", b"no-cache, private")]})
            gone = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_disconnect, receive, nursery.cancel_scope, gone)
                await self._stream(w, send, timeout)
                nursery.cancel_scope.cancel()
            disconnected = gone.is_set()
        finally:
            self._watchers.discard(w)
            self._notify()
        if not disconnected:
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _reached(self, rv: int) -> bool:
        """Whether the server's RV is (or, within ``too_large_rv_wait_s``, gets) at least
        ``rv``: kube-apiserver waits a while for a future RV before calling it too large."""
        if rv <= self.store.rv:
            return True
        with trio.move_on_after(self.too_large_rv_wait_s):
            await self.wait_until(lambda: self.store.rv >= rv, recheck_s=None)
        return rv <= self.store.rv

    async def _stream(self, w: Watcher, send: Send, timeout: float | None) -> None:
        start = trio.current_time()
        deadline = start + timeout if timeout is not None else math.inf
        interval = max(self.bookmark_interval_s, 0.001)
        next_bookmark = start + interval
        while True:
            w.wake = trio.Event()
            if w.closed:
                return
            if self._stalled:
                await w.wake.wait()
                continue
            if w.queue:
                line = w.queue.popleft()
                w.sent += 1
                await send({"type": "http.response.body", "body": line, "more_body": True})
                self._notify()
                continue
            if w.end_when_drained:
                return
            now = trio.current_time()
            if now >= deadline:
                return
            if w.bookmarks and now >= next_bookmark:
                bookmark = {"kind": w.res.kind, "apiVersion": w.res.api_version,
                            "metadata": {"resourceVersion": str(self.store.rv)}}
                next_bookmark = now + interval
                await send({"type": "http.response.body",
                            "body": event_line("BOOKMARK", bookmark), "more_body": True})
                self._notify()
                continue
            with trio.move_on_at(min(deadline, next_bookmark if w.bookmarks else math.inf)):
                await w.wake.wait()


__all__ = ["WatchStreams", "Watcher", "event_line"]
