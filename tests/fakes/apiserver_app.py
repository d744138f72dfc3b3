"""The fake Kubernetes API server as one ASGI app: :class:`FakeApiServer`.

Assembles the concerns (state, faults, watches, routing, discovery, control endpoints,
request log) into one object and answers each request as kube-apiserver's handler chain
does: injected faults first, then authentication (401), authorization (403), routing;
failures are ``Status`` objects, and an unexpected error in the fake is a 500
``InternalError`` (logged). ``/healthz``, ``/livez`` and ``/readyz`` answer ``ok``.
See :mod:`tests.fakes.apiserver` for what is real and what is simplified.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable
from urllib.parse import parse_qs

import trio

from tests.fakes.apiserver_control import ControlEndpoints
from tests.fakes.apiserver_discovery import Discovery
from tests.fakes.apiserver_errors import ApiError, status_body
from tests.fakes.apiserver_faults import (
    DEFAULT_USER,
    DenyRule,
    FaultControl,
    Hold,
    Injection,
)
from tests.fakes.apiserver_http import (
    Receive,
    Scope,
    Send,
    read_body,
    respond_json,
    respond_raw,
    truthy,
)
from tests.fakes.apiserver_requests import RecordedRequest, RequestLog
from tests.fakes.apiserver_resources import ResourceType
from tests.fakes.apiserver_routing import Routing
from tests.fakes.apiserver_state import DirectState
from tests.fakes.apiserver_store import DEFAULT_RESOURCES, Store
from tests.fakes.apiserver_watch import Watcher, WatchStreams

log = logging.getLogger("tests.fakes.apiserver")


class FakeApiServer(DirectState, FaultControl, WatchStreams, Routing, Discovery,
                    ControlEndpoints, RequestLog):
    """State, fault injection and introspection of one fake API server (an ASGI app)."""

    def __init__(
        self,
        *,
        token: str | None = None,
        bookmark_interval_s: float = 1.0,
        namespaces: Iterable[str] = ("trio-supervisor", "apps"),
        crds_installed: bool = True,
        defaulting: bool = True,
        validation: bool = True,
        resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
        history_limit: int = 10_000,
        too_large_rv_wait_s: float = 0.1,
    ) -> None:
        self.url = ""
        self.token = token
        self.bookmark_interval_s = bookmark_interval_s
        self.too_large_rv_wait_s = too_large_rv_wait_s
        self.store = Store(resources, crds_installed=crds_installed, defaulting=defaulting,
                           validation=validation, history_limit=history_limit)
        self.store.listeners.append(self._on_event)
        self.requests: list[RecordedRequest] = []
        self.injections: list[Injection] = []
        self.holds: list[Hold] = []
        self.deny_rules: list[DenyRule] = []
        self.user = DEFAULT_USER
        self._watchers: set[Watcher] = set()
        self._stalled = False
        self._changed = trio.Event()
        self._closing = trio.Event()
        self._namespaces = tuple(namespaces)
        for ns in self._namespaces:
            self.create_namespace(ns)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[], bool], *,
                         recheck_s: float | None = 0.05) -> None:
        """Wait until ``predicate()`` holds. It is re-checked after every request, state
        change, watch open/close and watch line sent, and (for predicates on client-side
        state that changes between those) every ``recheck_s`` (None: never). Wrap the call
        in ``trio.fail_after``."""
        while not predicate():
            with trio.move_on_after(math.inf if recheck_s is None else recheck_s):
                await self._changed.wait()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path.startswith("/_fake/"):
            await self._control(scope, receive, send)
            return
        if path in ("/healthz", "/livez", "/readyz"):
            await respond_raw(send, 200, b"ok", "text/plain")
            return
        await self._handle(scope, receive, send)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"].upper()
        path: str = scope["path"]
        qs = scope.get("query_string", b"").decode("latin-1")
        query = {k: v[-1] for k, v in parse_qs(qs, keep_blank_values=True).items()}
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        content_type = headers.get("content-type")
        rec = RecordedRequest(method, path, query, content_type,
                              field_manager=query.get("fieldManager"))
        rec.watch = truthy(query.get("watch")) or "/watch/" in path
        self.requests.append(rec)
        try:
            body = await read_body(receive) if method in ("POST", "PUT", "PATCH",
                                                          "DELETE") else b""
            rec.target = create_target(method, path, body)
            for held in self.holds:
                if held.matches(method, rec.target):
                    await self._wait_hold(held)
                    break
            for rule in self.injections:
                if rule.matches(method, rec.target, qs):
                    rule.hits += 1
                    rec.injected = True
                    await self._answer_injection(rule, rec, receive, send)
                    return
            self._authenticate(headers)
            await self._dispatch(method, path, query, headers, body, rec, receive, send)
        except ApiError as err:
            rec.status = err.code
            await respond_json(send, err.code, err.status(), err.headers)
        except Exception as exc:  # a bug in the fake: answer 500 and log it
            log.exception("fake apiserver: internal error on %s %s", method, path)
            rec.status = 500
            await respond_json(send, 500, status_body(500, "InternalError", repr(exc)))
        finally:
            self._notify()


def create_target(method: str, path: str, body: bytes) -> str:
    """The path a request is about: a POST's is its collection and the name it creates.

    Holds, injections and the request log match on it, so a test can aim at the
    create of one object (``POST .../deployments/web``) as at its patch.
    """
    if method != "POST" or not body:
        return path
    try:
        parsed = json.loads(body)
    except ValueError:
        return path
    name = ((parsed.get("metadata") or {}).get("name") if isinstance(parsed, dict) else None)
    return f"{path}/{name}" if isinstance(name, str) and name else path


__all__ = ["FakeApiServer", "create_target"]
