"""A fake Kubernetes API server over real HTTP on loopback, for tests.

No kube-apiserver can run here and tests never patch the client: they point it at
this server (``server.url``, plain HTTP, optional bearer token). It is an ASGI app
served by hypercorn's trio worker inside the caller's trio run
(:func:`run_fake_apiserver`), or as its own process
(``python -m tests.fakes.apiserver --port 0 --ready-file PATH``) driven over
``/_fake/...`` control endpoints (:class:`FakeControl`).

Real (behaves as a kube-apiserver does):

* Paths: ``/api/v1/namespaces[/{name}]``, ``/api/v1/namespaces/{ns}/{services,configmaps}``,
  ``/apis/apps/v1/.../deployments``, ``/apis/batch/v1/.../cronjobs``,
  ``/apis/platform.trio-supervisor.dev/v1/.../{servicedefinitions,workflows}`` with
  ``/status``, ``/apis/coordination.k8s.io/v1/.../leases`` (election tests:
  :mod:`tests.fakes.leases`); all-namespace lists and watches (``/apis/apps/v1/deployments``), the legacy
  ``/watch/`` prefix, discovery (``/api``, ``/apis``, ``/api/v1``, ``/apis/{g}/{v}``), ``/version``.
  Uninstalled CRDs 404 with a ``Status`` body and vanish from discovery.
* ``metadata.uid``, ``creationTimestamp``, ``resourceVersion`` from one global counter
  (strings), ``generation`` bumped only when something outside metadata and status changes.
* Lists: ``kind: <Kind>List``, items with kind/apiVersion, ``metadata.resourceVersion``,
  ``limit``/``continue`` (+ ``remainingItemCount``), ``labelSelector`` (``=``, ``==``, ``!=``,
  ``k``, ``!k``, ``in``, ``notin``), ``fieldSelector`` on metadata.name/namespace. A list in a
  missing namespace is empty.
* Watches: chunked newline-delimited JSON events after ``resourceVersion`` (no RV or
  ``0``: synthetic ADDED events for the current state first), selectors applied (an object
  leaving the selector is sent as DELETED, entering as ADDED), ``timeoutSeconds`` ends the stream
  cleanly, ``allowWatchBookmarks`` gives BOOKMARK events every ``bookmark_interval_s``, an RV
  older than the history window (see ``compact()``) gives an ``ERROR`` event carrying a 410
  ``Expired`` Status and the stream ends. DELETED objects carry the deletion's RV.
  ``compact()`` expires every RV handed out so far (and moves the RV on by one, so a fresh
  list gives a watchable RV); so does falling out of the ``history_limit`` window. A list with
  ``resourceVersionMatch=Exact`` and an expired RV, or an expired ``continue``, is a 410 too.
* An RV newer than the server's (after ``reset_state()``, an etcd restore): a watch from it
  waits up to ``too_large_rv_wait_s`` for the server to reach it (kube-apiserver's watch cache
  waits 3 s), then, as the watch cache does, answers 200 with one ``ERROR`` event carrying a
  504 ``Timeout`` Status (``Timeout: Too large resource version: N, current: M``, cause
  ``ResourceVersionTooLarge``, ``retryAfterSeconds: 1``) and ends the stream; client-go logs
  it as "watch of ... ended with: Timeout: Too large resource version". A list with such a
  non-zero ``resourceVersion`` gets the same Status as an HTTP 504 after the same wait.
* Writes: POST (201; 409 AlreadyExists; 404 when the namespace does not exist), PUT with the
  ``resourceVersion`` precondition (409 Conflict), PATCH merge-patch / JSON-patch /
  apply-patch+yaml (JSON or YAML body, ``fieldManager`` required, ``force``), DELETE (returns the
  object; ``preconditions`` honoured; deleting a namespace deletes its contents at once),
  DELETE on a collection (deletecollection), ``dryRun=All``. ``/status`` writes change only
  ``.status``; writes to the main resource ignore ``.status``. A write that changes nothing
  (identical content and field ownership, e.g. a repeated apply) does not bump the RV or the
  generation and sends no watch event.
* Server-side apply with per-manager field ownership (``metadata.managedFields``, FieldsV1):
  a manager's apply removes the fields it stopped applying (unless someone else owns them);
  changing a field another manager owns is a 409 ``Conflict`` with ``FieldManagerConflict``
  causes unless ``force=true``; update operations (PUT/merge patch/create) take ownership of
  the fields they change, so an apply after someone's "kubectl edit" conflicts.
* Defaulting (``defaulting=True``): Deployment replicas/revisionHistoryLimit/
  progressDeadlineSeconds/strategy, Service type/sessionAffinity/clusterIP(s)/ports protocol and
  targetPort, CronJob suspend/concurrencyPolicy/history limits and Job backoffLimit/completions/
  parallelism/completionMode/suspend, pod templates (restartPolicy, dnsPolicy, schedulerName,
  securityContext, terminationGracePeriodSeconds; containers' imagePullPolicy, resources,
  terminationMessagePath/Policy, ports protocol), ServiceDefinition replicas=1, Namespace phase
  and ``kubernetes.io/metadata.name`` label. So "skip the write when nothing changed" must not
  compare live specs with desired ones naively.
* Validation (``validation=True``, 422 Invalid Status with causes): names, label keys/values,
  Deployment selector present/matching the template/immutable, containers with name and image,
  Service ports, CronJob schedule and a job restartPolicy of OnFailure/Never, the CRD specs'
  types (ServiceDefinition image:str required, replicas:int, port:int, env:map[str]str; Workflow
  image and schedule required, args:[]str).
* Auth: bearer token (401 Status), ``set_token`` rotates it; ``deny()`` gives 403 Forbidden with
  the real message shape. Errors are ``Status`` objects throughout.

Simplified (documented gaps):

* Lists are not snapshots: a ``continue`` token resumes after the last key against the current
  state (it does 410 once the history is compacted past it); ``resourceVersion`` on a list is
  otherwise ignored (always "latest").
* Field ownership is at leaf granularity with atomic lists (true for CRDs without list-type
  markers; built-in associative lists such as containers are treated as atomic). Strategic merge
  patch is treated as a JSON merge patch for built-in resources (415 for CRDs, as real).
* No finalizers, graceful deletion, Terminating namespaces, ownerReference GC, admission,
  controllers (tests write Deployment status themselves with ``set_status``), protobuf, CBOR,
  ``sendInitialEvents``, or watch-cache RV semantics beyond "events after RV".
* A stalled watch (``stall_watches``) ignores its ``timeoutSeconds`` and bookmarks until
  unstalled or closed, as a stream hung behind a load balancer would; what queued meanwhile
  is delivered on ``unstall_watches``.
* One user for RBAC messages; no impersonation, no client certificates, no TLS.

Test helpers: ``wait_until(predicate)`` / ``wait_for_watches(n, plural)`` wait without fixed
sleeps; ``requests`` (:class:`RecordedRequest`), ``count()``, ``find_requests()``,
``writes()``; direct state access ``get/objects/create/apply/patch/set_status/delete/put_raw``;
``reset_state()`` wipes everything and restarts the RV counter (the RV goes backwards).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import math
import os
import re
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import parse_qs

import trio

from tests.fakes.apiserver_store import (
    CRD_GROUP,
    DEFAULT_RESOURCES,
    ApiError,
    Obj,
    ResourceType,
    Store,
    WatchEvent,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
    reason_for,
    status_body,
    too_large_resource_version,
)

log = logging.getLogger("tests.fakes.apiserver")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

DEFAULT_USER = "system:serviceaccount:trio-supervisor:trio-supervisor"
_PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


# --------------------------------------------------------------------------------------
# Records, injections, watchers


@dataclass
class RecordedRequest:
    """One request the server answered (control requests under ``/_fake`` excluded)."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    status: int = 0
    watch: bool = False
    changed: bool = False  # the request changed state (bumped the resourceVersion)
    injected: bool = False  # answered by an ``inject()`` rule
    field_manager: str | None = None
    body: Any = None  # the parsed request body (JSON/YAML), when there was one
    time: float = field(default_factory=time.monotonic)

    def to_json(self) -> Obj:
        data = asdict(self)
        return data


@dataclass
class Injection:
    """A fault rule: the next ``times`` matching requests get this response."""

    method: str
    path_regex: str
    status: int
    body: bytes | Obj | list[Any] | None = None
    headers: dict[str, str] | None = None
    times: int | None = 1  # None: forever
    query_contains: str | None = None
    hang: bool = False  # never answer (until the client goes away or the server stops)
    hits: int = 0

    def matches(self, method: str, path: str, query_string: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method not in ("*", method.upper()):
            return False
        if self.query_contains is not None and self.query_contains not in query_string:
            return False
        return re.search(self.path_regex, path) is not None

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times


@dataclass
class DenyRule:
    verb: str
    resource: str  # plural, or plural/subresource, or "*"
    namespace: str | None

    def matches(self, verb: str, resource: str, namespace: str | None) -> bool:
        return (
            self.verb in ("*", verb)
            and self.resource in ("*", resource)
            and (self.namespace is None or self.namespace == namespace)
        )


class _Watcher:
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
        self.push_line(_event_line(kind, obj))


def _json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _event_line(kind: str, obj: Obj) -> bytes:
    return _json({"type": kind, "object": obj}) + b"\n"


# --------------------------------------------------------------------------------------
# The server


class FakeApiServer:
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
        self.deny_rules: list[DenyRule] = []
        self.user = DEFAULT_USER
        self._watchers: set[_Watcher] = set()
        self._stalled = False
        self._changed = trio.Event()
        self._closing = trio.Event()
        self._namespaces = tuple(namespaces)
        for ns in self._namespaces:
            self.create_namespace(ns)

    # ---------------------------------------------------------------- notifications
    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _on_event(self, ev: WatchEvent) -> None:
        for w in list(self._watchers):
            kind = w.classify(ev)
            if kind is not None:
                w.push(kind, ev.obj)
        self._notify()

    async def wait_until(self, predicate: Callable[[], bool], *,
                         recheck_s: float | None = 0.05) -> None:
        """Wait until ``predicate()`` holds. It is re-checked after every request, state
        change, watch open/close and watch line sent, and (for predicates on client-side
        state that changes between those) every ``recheck_s`` (None: never). Wrap the call
        in ``trio.fail_after``."""
        while not predicate():
            with trio.move_on_after(math.inf if recheck_s is None else recheck_s):
                await self._changed.wait()

    async def wait_for_watches(self, n: int = 1, plural: str | None = None) -> None:
        """Wait until at least ``n`` watch streams (of ``plural``) are open."""
        await self.wait_until(lambda: self.open_watches(plural) >= n)

    def open_watches(self, plural: str | None = None) -> int:
        return sum(1 for w in self._watchers if plural in (None, w.res.plural))

    # ---------------------------------------------------------------- state (direct)
    @property
    def resource_version(self) -> int:
        """The current (latest) global resourceVersion."""
        return self.store.rv

    def register_resource(self, res: ResourceType, *, installed: bool = True) -> None:
        self.store.register(res, installed=installed)

    def _res(self, plural: str) -> ResourceType:
        return self.store.resource(plural)

    def get(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        obj = self.store.find(self._res(plural), namespace, name)
        return copy.deepcopy(obj) if obj is not None else None

    def objects(self, plural: str, namespace: str | None = None, *,
                label_selector: str | None = None) -> list[Obj]:
        items, _, _, _ = self.store.list_objects(self._res(plural), namespace,
                                         labels=parse_label_selector(label_selector))
        return copy.deepcopy(items)

    def create(self, obj: Obj, *, field_manager: str = "fake-test") -> Obj:
        """Create like a POST (validation, defaulting, 409, missing namespace -> 404);
        raises :class:`ApiError`."""
        res = self.store.resource_of(obj)
        ns = _direct_namespace(res, obj)
        result = self.store.create(res, ns, copy.deepcopy(obj), field_manager)
        return copy.deepcopy(result.obj)

    def apply(self, obj: Obj, *, field_manager: str = "fake-test", force: bool = False,
              subresource: str = "") -> Obj:
        """Server-side apply as ``field_manager``; raises :class:`ApiError` (e.g. 409)."""
        res = self.store.resource_of(obj)
        md = obj.get("metadata") or {}
        ns = _direct_namespace(res, obj)
        result = self.store.patch(res, ns, md.get("name", ""), "apply", copy.deepcopy(obj),
                                  field_manager, subresource, force)
        return copy.deepcopy(result.obj)

    def patch(self, plural: str, namespace: str | None, name: str, patch: Obj, *,
              field_manager: str = "fake-test", subresource: str = "") -> Obj:
        """A JSON merge patch as ``field_manager`` (like ``kubectl edit``/``patch``)."""
        result = self.store.patch(self._res(plural), namespace or "", name, "merge",
                                  copy.deepcopy(patch), field_manager, subresource)
        return copy.deepcopy(result.obj)

    def set_status(self, plural: str, namespace: str | None, name: str, status: Obj, *,
                   field_manager: str = "fake-controller") -> Obj:
        """Replace ``.status`` (what a controller such as the Deployment controller does)."""
        res = self._res(plural)
        existing = self.store.get(res, namespace, name)
        body = copy.deepcopy(existing)
        body["status"] = copy.deepcopy(status)
        result = self.store.replace(res, namespace or "", name, body, field_manager, "status")
        return copy.deepcopy(result.obj)

    def delete(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        """Delete if present; returns the deleted object (None when absent)."""
        res = self._res(plural)
        if self.store.find(res, namespace, name) is None:
            return None
        return copy.deepcopy(self.store.delete(res, namespace or "", name).obj)

    def put_raw(self, obj: Obj) -> Obj:
        """Store ``obj`` bypassing validation and defaulting (schema-skew cases); watchers
        get ADDED/MODIFIED with it as given (plus uid/RV)."""
        return copy.deepcopy(self.store.put_raw(copy.deepcopy(obj)))

    def create_namespace(self, name: str) -> Obj:
        existing = self.get("namespaces", None, name)
        if existing is not None:
            return existing
        return self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def compact(self) -> int:
        """Drop the watch history: a watch (or continue token) from any RV older than the
        current one now gets 410 Expired. Returns the current RV."""
        rv = self.store.compact()
        self._notify()
        return rv

    def reset_state(self, *, keep_crds: bool = True,
                    namespaces: Iterable[str] | None = None) -> int:
        """An etcd restored from an empty backup behind a restarted API server: every object
        goes (no watch events), the resourceVersion counter starts again (so a client's RV
        is now newer than the server's: see "An RV newer than the server's" above), open
        watches end cleanly, and ``namespaces`` (None: those the server started with) are
        created again. The CRDs stay installed unless ``keep_crds=False``. Injections, deny
        rules, the token and the request log are the test's, not etcd's: they stay.
        Returns the new resourceVersion."""
        self.close_watches()
        self.store.reset(keep_crds=keep_crds)
        for ns in self._namespaces if namespaces is None else namespaces:
            self.create_namespace(ns)
        self._notify()
        return self.store.rv

    def uninstall_crd(self, plural: str, *, keep_objects: bool = False) -> None:
        """Remove a CRD: its paths 404 and it leaves discovery. Like a real CRD deletion its
        objects are deleted (DELETED events) and its watches end; ``keep_objects=True`` hides
        them instead, and they reappear on ``install_crd``."""
        res = self._res(plural)
        if not keep_objects:
            for key in sorted(self.store.objects[plural]):
                self.store.delete(res, key[0], key[1])
        self.store.installed.discard(plural)
        self.close_watches(plural, drain=True)

    def install_crd(self, plural: str) -> None:
        self._res(plural)
        self.store.installed.add(plural)
        self._notify()

    def crd_installed(self, plural: str) -> bool:
        return plural in self.store.installed

    # ---------------------------------------------------------------- faults
    def set_token(self, token: str | None) -> None:
        """Rotate the accepted bearer token (None: no authentication)."""
        self.token = token

    def deny(self, verb: str, plural: str, namespace: str | None = None) -> DenyRule:
        """RBAC denial: ``verb`` (get/list/watch/create/update/patch/delete/deletecollection
        or ``*``) on ``plural`` (``servicedefinitions/status`` for a subresource, ``*``) ->
        403 Forbidden."""
        rule = DenyRule(verb, plural, namespace)
        self.deny_rules.append(rule)
        return rule

    def allow(self, rule: DenyRule | None = None) -> None:
        """Remove one deny rule, or all of them."""
        if rule is None:
            self.deny_rules.clear()
        else:
            self.deny_rules.remove(rule)

    def inject(
        self,
        method: str,
        path_regex: str,
        *,
        status: int,
        body: bytes | Obj | list[Any] | None = None,
        headers: Mapping[str, str] | None = None,
        times: int | None = 1,
        query_contains: str | None = None,
        hang: bool = False,
    ) -> Injection:
        """Answer the next ``times`` (None: all) requests whose method matches (``*`` for
        any) and whose path matches ``re.search(path_regex)`` with ``status`` and ``body``
        (bytes as is, a dict/list as JSON, None: a Status for the code). A 429 gets
        ``Retry-After: 1`` unless ``headers`` give one. ``query_contains`` narrows to e.g.
        ``"watch=1"``; ``hang=True`` never answers. Injection comes before auth."""
        rule = Injection(method.upper(), path_regex, status, body,
                         dict(headers) if headers else None, times, query_contains, hang)
        self.injections.append(rule)
        return rule

    def clear_injections(self) -> None:
        self.injections.clear()

    def stall_watches(self) -> None:
        """Open watch streams send nothing from now on, new ones hang after the headers
        (no events, no bookmarks, no server timeout) until ``unstall_watches``."""
        self._stalled = True
        self._wake_all()

    def unstall_watches(self) -> None:
        self._stalled = False
        self._wake_all()

    @property
    def stalled(self) -> bool:
        return self._stalled

    def close_watches(self, plural: str | None = None, *, drain: bool = False) -> None:
        """End open watch streams cleanly (the terminating chunk is sent), as a server
        restart or a load balancer would. Events not yet sent are dropped (the client gets
        them by re-watching from its last RV) unless ``drain=True``."""
        for w in list(self._watchers):
            if plural in (None, w.res.plural):
                if drain:
                    w.end_when_drained = True
                else:
                    w.closed = True
                w.wake.set()
        self._notify()

    def inject_watch_line(self, line: bytes, plural: str | None = None) -> int:
        """Send ``line`` (e.g. malformed JSON) as-is on open watches; returns how many."""
        if not line.endswith(b"\n"):
            line += b"\n"
        n = 0
        for w in list(self._watchers):
            if plural in (None, w.res.plural):
                w.push_line(line)
                n += 1
        return n

    def _wake_all(self) -> None:
        for w in list(self._watchers):
            w.wake.set()
        self._notify()

    # ---------------------------------------------------------------- introspection
    def count(self, method: str | None = None, path_contains: str | None = None, *,
              watch: bool | None = None, status: int | None = None) -> int:
        return len(self.find_requests(method, path_contains, watch=watch, status=status))

    def find_requests(self, method: str | None = None, path_contains: str | None = None, *,
                      watch: bool | None = None, status: int | None = None,
                      ) -> list[RecordedRequest]:
        return [
            r for r in self.requests
            if (method is None or r.method == method.upper())
            and (path_contains is None or path_contains in r.path)
            and (watch is None or r.watch == watch)
            and (status is None or r.status == status)
        ]

    def writes(self, path_contains: str | None = None) -> list[RecordedRequest]:
        """Non-GET requests that changed state (a no-op apply is not one)."""
        return [r for r in self.requests if r.method != "GET" and r.changed
                and (path_contains is None or path_contains in r.path)]

    def clear_requests(self) -> None:
        self.requests.clear()

    # ---------------------------------------------------------------- ASGI
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
            await _respond_raw(send, 200, b"ok", "text/plain")
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
        rec.watch = _truthy(query.get("watch")) or "/watch/" in path
        self.requests.append(rec)
        try:
            for rule in self.injections:
                if rule.matches(method, path, qs):
                    rule.hits += 1
                    rec.injected = True
                    await self._answer_injection(rule, rec, receive, send)
                    return
            body = await _read_body(receive) if method in ("POST", "PUT", "PATCH",
                                                           "DELETE") else b""
            self._authenticate(headers)
            await self._dispatch(method, path, query, headers, body, rec, receive, send)
        except ApiError as err:
            rec.status = err.code
            await _respond_json(send, err.code, err.status(), err.headers)
        except Exception as exc:  # a bug in the fake: answer 500 and log it
            log.exception("fake apiserver: internal error on %s %s", method, path)
            rec.status = 500
            await _respond_json(send, 500, status_body(500, "InternalError", repr(exc)))
        finally:
            self._notify()

    async def _answer_injection(self, rule: Injection, rec: RecordedRequest,
                                receive: Receive, send: Send) -> None:
        rec.status = rule.status
        if rule.hang:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_wait_disconnect, receive, nursery.cancel_scope)
                await self._closing.wait()
                nursery.cancel_scope.cancel()
            return
        headers = dict(rule.headers or {})
        if rule.status == 429 and not any(k.lower() == "retry-after" for k in headers):
            headers["Retry-After"] = "1"
        if isinstance(rule.body, bytes):
            ctype = next((v for k, v in headers.items() if k.lower() == "content-type"),
                         "application/json")
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
            await _respond_raw(send, rule.status, rule.body, ctype, headers)
        elif rule.body is not None:
            await _respond_json(send, rule.status, rule.body, headers)
        else:
            await _respond_json(send, rule.status, status_body(rule.status), headers)

    def _authenticate(self, headers: Mapping[str, str]) -> None:
        if self.token is None:
            return
        scheme, _, value = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or value.strip() != self.token:
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def _authorize(self, verb: str, res_name: str, group: str, ns: str | None,
                   name: str | None) -> None:
        for rule in self.deny_rules:
            if rule.matches(verb, res_name, ns):
                plural = res_name.partition("/")[0]
                qualified = f"{plural}.{group}" if group else plural
                who = f'{qualified} "{name}"' if name else qualified
                where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
                details: Obj = {"group": group, "kind": plural}
                if name:
                    details["name"] = name
                raise ApiError(
                    403, "Forbidden",
                    f'{who} is forbidden: User "{self.user}" cannot {verb} resource '
                    f'"{res_name}" in API group "{group}"{where}',
                    details=details)

    # ---------------------------------------------------------------- routing
    async def _dispatch(self, method: str, path: str, query: dict[str, str],
                        headers: Mapping[str, str], raw: bytes, rec: RecordedRequest,
                        receive: Receive, send: Send) -> None:
        parts = [p for p in path.split("/") if p]
        if parts == ["version"]:
            rec.status = 200
            await _respond_json(send, 200, {"major": "1", "minor": "31",
                                            "gitVersion": "v1.31.0-fake",
                                            "platform": "linux/amd64"})
            return
        if not parts or parts[0] not in ("api", "apis"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        if parts[0] == "api":
            if len(parts) == 1:
                rec.status = 200
                await _respond_json(send, 200, {"kind": "APIVersions", "versions": ["v1"]})
                return
            group, version, rest = "", parts[1], parts[2:]
        else:
            if len(parts) == 1:
                rec.status = 200
                await _respond_json(send, 200, self._group_list())
                return
            if len(parts) == 2:
                rec.status = 200
                await _respond_json(send, 200, self._group(parts[1]))
                return
            group, version, rest = parts[1], parts[2], parts[3:]
        watch = False
        if rest[:1] == ["watch"]:
            watch, rest = True, rest[1:]
        if not rest:
            rec.status = 200
            await _respond_json(send, 200, self._resource_list(group, version))
            return
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (
                len(rest) == 3 and rest[2] in ("status", "finalize")):
            ns, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        watch = watch or _truthy(query.get("watch"))
        verb = _verb(method, name is not None, watch)
        self._authorize(verb, f"{plural}/{sub}" if sub else plural, group, ns, name)
        res = self.store.lookup(group, version, plural)
        if sub and sub != "status":
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        if res.namespaced and ns is None and name is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        if not res.namespaced and ns is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        if watch:
            rec.watch = True
            await self._watch(res, ns, name, query, rec, receive, send)
            return
        manager = query.get("fieldManager") or _default_manager(headers)
        dry_run = query.get("dryRun") == "All"
        nsv = ns or ""
        if method == "GET":
            if name is None:
                await self._list(res, ns, query, rec, send)
                return
            rec.status = 200
            await _respond_json(send, 200, self.store.get(res, ns, name))
            return
        if method == "POST" and name is None:
            if ns is None and res.namespaced:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method "
                                                        "on the requested resource")
            body = _parse_json(raw)
            rec.body = body
            result = self.store.create(res, nsv, body, manager, dry_run)
            rec.changed = result.changed
            rec.status = 201
            await _respond_json(send, 201, result.obj)
            return
        if method == "PUT" and name is not None:
            body = _parse_json(raw)
            rec.body = body
            result = self.store.replace(res, nsv, name, body, manager, sub, dry_run)
            rec.changed = result.changed
            rec.status = 200
            await _respond_json(send, 200, result.obj)
            return
        if method == "PATCH" and name is not None:
            ctype = (headers.get("content-type") or "").split(";")[0].strip().lower()
            ptype = _PATCH_TYPES.get(ctype)
            if ptype is None or (ptype == "strategic" and res.crd):
                raise ApiError(
                    415, "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: application/json-patch+json, application/merge-patch+json, "
                    f"application/apply-patch+yaml{'' if res.crd else ', application/strategic-merge-patch+json'}")
            if ptype == "strategic":
                ptype = "merge"
            body = _parse_yaml(raw) if ptype == "apply" else _parse_json(raw)
            rec.body = body
            apply_manager = query.get("fieldManager") if ptype == "apply" else manager
            result = self.store.patch(res, nsv, name, ptype, body, apply_manager, sub,
                                      _truthy(query.get("force")), dry_run)
            rec.changed = result.changed
            rec.status = 201 if result.created else 200
            await _respond_json(send, rec.status, result.obj)
            return
        if method == "DELETE" and name is not None and not sub:
            options = _parse_json(raw) if raw.strip() else None
            rec.body = options
            if query.get("dryRun") == "All" or (isinstance(options, dict) and options.get(
                    "dryRun") == ["All"]):
                dry_run = True
            result = self.store.delete(res, nsv, name, options, dry_run)
            rec.changed = result.changed
            rec.status = 200
            await _respond_json(send, 200, result.obj)
            return
        if method == "DELETE" and name is None:
            items, _, _, _ = self.store.list_objects(
                res, ns, labels=parse_label_selector(query.get("labelSelector")),
                fields=parse_field_selector(query.get("fieldSelector")))
            deleted = []
            for obj in list(items):
                md = obj["metadata"]
                if not dry_run:
                    deleted.append(self.store.delete(res, md.get("namespace", ""),
                                                     md["name"]).obj)
                else:
                    deleted.append(obj)
            rec.changed = bool(deleted) and not dry_run
            rec.status = 200
            await _respond_json(send, 200, {
                "kind": res.list_kind, "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(self.store.rv)}, "items": deleted})
            return
        raise ApiError(405, "MethodNotAllowed",
                       "the server does not allow this method on the requested resource")

    async def _list(self, res: ResourceType, ns: str | None, query: Mapping[str, str],
                    rec: RecordedRequest, send: Send) -> None:
        limit = None
        if query.get("limit"):
            try:
                limit = int(query["limit"])
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"invalid limit: {query['limit']}") from exc
        exact = query.get("resourceVersionMatch") == "Exact"
        rv_param = query.get("resourceVersion", "")
        if rv_param.isdigit() and not await self._reached(int(rv_param)):
            raise too_large_resource_version(int(rv_param), self.store.rv)
        if exact and query.get("resourceVersion", "").isdigit() and int(
                query["resourceVersion"]) < self.store.floor:
            raise ApiError(410, "Expired", f"too old resource version: "
                                           f"{query['resourceVersion']} ({self.store.floor})")
        items, rv, cont, remaining = self.store.list_objects(
            res, ns,
            labels=parse_label_selector(query.get("labelSelector")),
            fields=parse_field_selector(query.get("fieldSelector")),
            limit=limit, cont=query.get("continue") or None)
        meta: Obj = {"resourceVersion": rv}
        if cont:
            meta["continue"] = cont
            meta["remainingItemCount"] = remaining
        rec.status = 200
        await _respond_json(send, 200, {"kind": res.list_kind, "apiVersion": res.api_version,
                                        "metadata": meta, "items": items})

    # ---------------------------------------------------------------- watch
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
        w = _Watcher(res, ns, labels, fields, _truthy(query.get("allowWatchBookmarks")))
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
                nursery.start_soon(_wait_disconnect, receive, nursery.cancel_scope, gone)
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

    async def _stream(self, w: _Watcher, send: Send, timeout: float | None) -> None:
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
                            "body": _event_line("BOOKMARK", bookmark), "more_body": True})
                self._notify()
                continue
            with trio.move_on_at(min(deadline, next_bookmark if w.bookmarks else math.inf)):
                await w.wake.wait()

    # ---------------------------------------------------------------- discovery
    def _installed(self) -> list[ResourceType]:
        return [r for r in self.store.by_plural.values() if r.plural in self.store.installed]

    def _group_list(self) -> Obj:
        groups: dict[str, list[str]] = {}
        for r in self._installed():
            if r.group:
                versions = groups.setdefault(r.group, [])
                if r.version not in versions:
                    versions.append(r.version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            _group_obj(g, vs) for g, vs in groups.items()]}

    def _group(self, group: str) -> Obj:
        versions = []
        for r in self._installed():
            if r.group == group and r.version not in versions:
                versions.append(r.version)
        if not versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        return {"kind": "APIGroup", "apiVersion": "v1", **_group_obj(group, versions)}

    def _resource_list(self, group: str, version: str) -> Obj:
        rows = [r for r in self._installed() if r.group == group and r.version == version]
        if not rows:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           details={})
        resources: list[Obj] = []
        for r in rows:
            resources.append({
                "name": r.plural, "singularName": r.singular or r.kind.lower(),
                "namespaced": r.namespaced, "kind": r.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch",
                          "update", "watch"],
                "shortNames": list(r.short_names)})
            resources.append({"name": f"{r.plural}/status", "singularName": "",
                              "namespaced": r.namespaced, "kind": r.kind,
                              "verbs": ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}

    # ---------------------------------------------------------------- control endpoints
    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        op = scope["path"][len("/_fake/"):].strip("/")
        qs = scope.get("query_string", b"").decode("latin-1")
        q = {k: v[-1] for k, v in parse_qs(qs, keep_blank_values=True).items()}
        raw = await _read_body(receive)
        try:
            body = _parse_json(raw) if raw.strip() else None
            result = self._control_op(op, q, body)
        except ApiError as err:
            await _respond_json(send, err.code, err.status())
            return
        except (KeyError, TypeError, ValueError) as exc:
            await _respond_json(send, 400, status_body(400, "BadRequest", repr(exc)))
            return
        finally:
            self._notify()
        await _respond_json(send, 200, result)

    def _control_op(self, op: str, q: Mapping[str, str], body: Any) -> Any:
        ns = q.get("namespace") or None
        if op == "state":
            return {"url": self.url, "resourceVersion": self.store.rv,
                    "watches": self.open_watches(), "stalled": self._stalled,
                    "installed": sorted(self.store.installed)}
        if op == "create":
            return self.create(body, field_manager=q.get("fieldManager", "fake-test"))
        if op == "apply":
            return self.apply(body, field_manager=q.get("fieldManager", "fake-test"),
                              force=_truthy(q.get("force")))
        if op == "put-raw":
            return self.put_raw(body)
        if op == "set-status":
            return self.set_status(q["plural"], ns, q["name"], body)
        if op == "delete":
            return self.delete(q["plural"], ns, q["name"])
        if op == "objects":
            return {"items": self.objects(q["plural"], ns,
                                          label_selector=q.get("labelSelector"))}
        if op == "object":
            obj = self.get(q["plural"], ns, q["name"])
            if obj is None:
                raise ApiError(404, "NotFound", f'{q["plural"]} "{q["name"]}" not found')
            return obj
        if op == "namespaces":
            return self.create_namespace(q["name"])
        if op == "stall":
            self.stall_watches()
        elif op == "unstall":
            self.unstall_watches()
        elif op == "compact":
            return {"resourceVersion": self.compact()}
        elif op == "reset":
            names = q.get("namespaces")
            return {"resourceVersion": self.reset_state(
                keep_crds=q.get("keepCrds", "true").lower() != "false",
                namespaces=None if names is None else [n for n in names.split(",") if n])}
        elif op == "close-watches":
            self.close_watches(q.get("plural"))
        elif op == "uninstall-crd":
            self.uninstall_crd(q["plural"], keep_objects=_truthy(q.get("keepObjects")))
        elif op == "install-crd":
            self.install_crd(q["plural"])
        elif op == "token":
            self.set_token((body or {}).get("token") if body is not None else q.get("token"))
        elif op == "deny":
            self.deny(body["verb"], body["plural"], body.get("namespace"))
        elif op == "allow":
            self.allow()
        elif op == "inject":
            raw_body = body.get("body")
            if isinstance(body.get("raw"), str):
                raw_body = body["raw"].encode()
            self.inject(body.get("method", "*"), body["path_regex"], status=int(body["status"]),
                        body=raw_body, headers=body.get("headers"),
                        times=body.get("times", 1), query_contains=body.get("query_contains"),
                        hang=bool(body.get("hang", False)))
        elif op == "clear-injections":
            self.clear_injections()
        elif op == "requests":
            return [r.to_json() for r in self.requests]
        elif op == "clear-requests":
            self.clear_requests()
        else:
            raise ApiError(404, "NotFound", f"unknown control operation {op!r}")
        return {"ok": True}


# --------------------------------------------------------------------------------------
# HTTP helpers


def _direct_namespace(res: ResourceType, obj: Obj) -> str:
    if not res.namespaced:
        return ""
    ns = (obj.get("metadata") or {}).get("namespace")
    if not ns:
        raise ValueError(f"{res.kind} {obj.get('metadata', {}).get('name')!r}: "
                         "metadata.namespace is required")
    return str(ns)


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


def _verb(method: str, named: bool, watch: bool) -> str:
    if watch:
        return "watch"
    return {
        "GET": "get" if named else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }.get(method, method.lower())


def _default_manager(headers: Mapping[str, str]) -> str:
    agent = headers.get("user-agent", "unknown")
    return agent.split("/")[0] or "unknown"


def _group_obj(group: str, versions: list[str]) -> Obj:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def _parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"error decoding request body: {exc}") from exc


def _parse_yaml(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - PyYAML comes with kubernetes
        raise ApiError(400, "BadRequest", "apply body is not JSON and PyYAML is missing") from exc

    class _Loader(yaml.SafeLoader):  # type: ignore[misc]
        """Timestamps stay strings, as when Kubernetes converts YAML to JSON."""

    _Loader.yaml_implicit_resolvers = {
        key: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    try:
        return yaml.load(raw, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ApiError(400, "BadRequest", f"error decoding YAML: {exc}") from exc


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            break
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            break
    return b"".join(chunks)


async def _wait_disconnect(receive: Receive, scope: trio.CancelScope,
                           gone: trio.Event | None = None) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            if gone is not None:
                gone.set()
            scope.cancel()
            return


async def _respond_raw(send: Send, status: int, body: bytes, content_type: str,
                       headers: Mapping[str, str] | None = None) -> None:
    hdrs = [(b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode())]
    hdrs += [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _respond_json(send: Send, status: int, data: Any,
                        headers: Mapping[str, str] | None = None) -> None:
    await _respond_raw(send, status, _json(data), "application/json", headers)


# --------------------------------------------------------------------------------------
# Running it


@contextlib.asynccontextmanager
async def run_fake_apiserver(
    *,
    token: str | None = None,
    bookmark_interval_s: float = 1.0,
    namespaces: Iterable[str] = ("trio-supervisor", "apps"),
    crds_installed: bool = True,
    defaulting: bool = True,
    validation: bool = True,
    history_limit: int = 10_000,
    too_large_rv_wait_s: float = 0.1,
    host: str = "127.0.0.1",
    port: int = 0,
    resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
) -> AsyncIterator[FakeApiServer]:
    """Serve a :class:`FakeApiServer` on ``host:port`` (port 0: the OS picks) inside the
    caller's trio run; ``server.url`` is set on entry, everything stops on exit."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    server = FakeApiServer(token=token, bookmark_interval_s=bookmark_interval_s,
                           namespaces=namespaces, crds_installed=crds_installed,
                           defaulting=defaulting, validation=validation,
                           history_limit=history_limit, too_large_rv_wait_s=too_large_rv_wait_s,
                           resources=resources)
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("tests.fakes.apiserver.hypercorn")
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = 30.0
    shutdown = trio.Event()

    async def _trigger() -> None:
        await shutdown.wait()

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(cast(Any, server), config, shutdown_trigger=_trigger,
                                      task_status=task_status))
        server.url = binds[0]
        try:
            yield server
        finally:
            server._closing.set()
            server.close_watches()
            shutdown.set()
            nursery.cancel_scope.deadline = trio.current_time() + 3.0


class _HasUrl(Protocol):
    url: str
    token: str | None


def write_kubeconfig(server: _HasUrl, path: str | os.PathLike[str], *,
                     token_file: str | None = None, namespace: str = "trio-supervisor") -> None:
    """Write a kubeconfig (JSON, valid YAML) that ``kubernetes.config.load_kube_config``
    accepts, pointing at ``server.url`` over plain HTTP; the user has ``tokenFile`` when
    given, else ``server.token`` (or no credentials)."""
    user: Obj = {}
    if token_file is not None:
        user["tokenFile"] = os.fspath(token_file)
    elif server.token is not None:
        user["token"] = server.token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "fake", "user": user}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                  "namespace": namespace}}],
        "current-context": "fake",
        "preferences": {},
    }
    Path(path).write_text(json.dumps(config, indent=2) + "\n")


class FakeControl:
    """Drive a fake API server running as its own process, over ``/_fake/...``."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    async def _call(self, method: str, op: str, *, params: Mapping[str, Any] | None = None,
                    body: Any = None) -> Any:
        import httpx

        async with httpx.AsyncClient(base_url=self.url, timeout=10.0) as client:
            resp = await client.request(
                method, f"/_fake/{op}",
                params={k: v for k, v in (params or {}).items() if v is not None},
                content=None if body is None else json.dumps(body).encode(),
                headers={"content-type": "application/json"})
        data = resp.json()
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, data.get("reason", reason_for(resp.status_code)),
                           data.get("message", ""))
        return data

    async def state(self) -> Obj:
        return dict(await self._call("GET", "state"))

    async def create(self, obj: Obj) -> Obj:
        return dict(await self._call("POST", "create", body=obj))

    async def apply(self, obj: Obj, *, field_manager: str = "fake-test",
                    force: bool = False) -> Obj:
        return dict(await self._call("POST", "apply", body=obj, params={
            "fieldManager": field_manager, "force": "true" if force else None}))

    async def put_raw(self, obj: Obj) -> Obj:
        return dict(await self._call("POST", "put-raw", body=obj))

    async def set_status(self, plural: str, namespace: str | None, name: str,
                         status: Obj) -> Obj:
        return dict(await self._call("POST", "set-status", body=status, params={
            "plural": plural, "namespace": namespace, "name": name}))

    async def delete(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        result = await self._call("POST", "delete", params={
            "plural": plural, "namespace": namespace, "name": name})
        return dict(result) if result else None

    async def objects(self, plural: str, namespace: str | None = None, *,
                      label_selector: str | None = None) -> list[Obj]:
        data = await self._call("GET", "objects", params={
            "plural": plural, "namespace": namespace, "labelSelector": label_selector})
        return list(data["items"])

    async def get(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        try:
            return dict(await self._call("GET", "object", params={
                "plural": plural, "namespace": namespace, "name": name}))
        except ApiError as err:
            if err.code == 404:
                return None
            raise

    async def create_namespace(self, name: str) -> Obj:
        return dict(await self._call("POST", "namespaces", params={"name": name}))

    async def stall_watches(self) -> None:
        await self._call("POST", "stall")

    async def unstall_watches(self) -> None:
        await self._call("POST", "unstall")

    async def compact(self) -> int:
        return int((await self._call("POST", "compact"))["resourceVersion"])

    async def reset_state(self, *, keep_crds: bool = True,
                          namespaces: Iterable[str] | None = None) -> int:
        params = {"keepCrds": "true" if keep_crds else "false",
                  "namespaces": None if namespaces is None else ",".join(namespaces)}
        return int((await self._call("POST", "reset", params=params))["resourceVersion"])

    async def close_watches(self, plural: str | None = None) -> None:
        await self._call("POST", "close-watches", params={"plural": plural})

    async def uninstall_crd(self, plural: str, *, keep_objects: bool = False) -> None:
        await self._call("POST", "uninstall-crd", params={
            "plural": plural, "keepObjects": "true" if keep_objects else None})

    async def install_crd(self, plural: str) -> None:
        await self._call("POST", "install-crd", params={"plural": plural})

    async def set_token(self, token: str | None) -> None:
        self.token = token
        await self._call("POST", "token", body={"token": token})

    async def deny(self, verb: str, plural: str, namespace: str | None = None) -> None:
        await self._call("POST", "deny", body={"verb": verb, "plural": plural,
                                               "namespace": namespace})

    async def allow(self) -> None:
        await self._call("POST", "allow")

    async def inject(self, method: str, path_regex: str, *, status: int,
                     body: bytes | Obj | None = None, headers: Mapping[str, str] | None = None,
                     times: int | None = 1, query_contains: str | None = None,
                     hang: bool = False) -> None:
        payload: Obj = {"method": method, "path_regex": path_regex, "status": status,
                        "headers": dict(headers) if headers else None, "times": times,
                        "query_contains": query_contains, "hang": hang}
        if isinstance(body, bytes):
            payload["raw"] = body.decode()
        else:
            payload["body"] = body
        await self._call("POST", "inject", body=payload)

    async def clear_injections(self) -> None:
        await self._call("POST", "clear-injections")

    async def requests(self) -> list[Obj]:
        return list(await self._call("GET", "requests"))

    async def clear_requests(self) -> None:
        await self._call("POST", "clear-requests")


# --------------------------------------------------------------------------------------
# Process mode


def _write_ready(path: str, url: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(url + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


async def _serve_process(args: argparse.Namespace) -> None:
    namespaces = [n for n in args.namespaces.split(",") if n]
    async with run_fake_apiserver(token=args.token, bookmark_interval_s=args.bookmark_interval,
                                  namespaces=namespaces, crds_installed=not args.no_crds,
                                  too_large_rv_wait_s=args.too_large_rv_wait,
                                  host=args.host, port=args.port) as server:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            if args.ready_file:
                _write_ready(args.ready_file, server.url)
            print(server.url, flush=True)
            async for _ in signals:
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.apiserver",
                                     description="Fake Kubernetes API server for tests.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", help="write the URL here once listening")
    parser.add_argument("--token", help="require this bearer token")
    parser.add_argument("--bookmark-interval", type=float, default=1.0)
    parser.add_argument("--namespaces", default="trio-supervisor,apps",
                        help="comma-separated namespaces to create")
    parser.add_argument("--no-crds", action="store_true", help="start with the CRDs absent")
    parser.add_argument("--too-large-rv-wait", type=float, default=0.1,
                        help="seconds a watch or list from a future resourceVersion waits "
                             "before its 'Too large resource version' error")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    trio.run(_serve_process, args)
    return 0


__all__ = [
    "CRD_GROUP",
    "ApiError",
    "DenyRule",
    "FakeApiServer",
    "FakeControl",
    "Injection",
    "RecordedRequest",
    "ResourceType",
    "main",
    "run_fake_apiserver",
    "write_kubeconfig",
]


if __name__ == "__main__":
    sys.exit(main())
