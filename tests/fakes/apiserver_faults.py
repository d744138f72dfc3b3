"""Fault control of the fake Kubernetes API server: injected answers, auth, stalled watches.

Each fault follows what a real cluster does to a client: ``inject()`` answers matching
requests with a given status and body (a ``Status`` for the code when no body is given; a
429 gets ``Retry-After: 1`` as kube-apiserver's max-in-flight filter sends) or never
answers (``hang``); a wrong bearer token is a 401 ``Unauthorized`` Status; ``deny()``
is a 403 ``Forbidden`` with RBAC's message (``User "..." cannot <verb> resource ...``);
``stall_watches()`` is a stream hung behind a load balancer; ``hold_watch_headers()`` a
watch whose response headers never come (an overloaded server, a proxy holding it); ``close_watches()`` ends
streams as a server restart does; ``inject_watch_line()`` sends a raw (e.g. malformed)
line on open watches; ``hold()`` keeps matching requests in flight (a slow write on
the wire) until the test releases them, then serves them as usual: the server's state
changes meanwhile (a parent deleted while its child's apply is held).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from tests.fakes.apiserver_errors import ApiError, status_body
from tests.fakes.apiserver_http import Receive, Send, respond_json, respond_raw, wait_disconnect
from tests.fakes.apiserver_requests import RecordedRequest
from tests.fakes.apiserver_resources import Obj
from tests.fakes.apiserver_watch import Watcher

DEFAULT_USER = "system:serviceaccount:trio-supervisor:trio-supervisor"


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
class Hold:
    """A hold rule: the next ``times`` matching requests wait until :meth:`release`.

    A held request has been received but not served: it is served as usual (auth,
    routing, the state of that moment) once released. ``arrived`` counts the requests
    held so far (wait for it with ``wait_until``).
    """

    method: str
    path_regex: str
    times: int | None = 1  # None: every matching request until released
    arrived: int = 0
    released: trio.Event = field(default_factory=trio.Event)

    def matches(self, method: str, path: str) -> bool:
        if self.released.is_set() or (self.times is not None and self.arrived >= self.times):
            return False
        return self.method in ("*", method.upper()) and re.search(self.path_regex,
                                                                   path) is not None

    def release(self) -> None:
        self.released.set()


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


class FaultControl:
    """The fault methods of :class:`~tests.fakes.apiserver.FakeApiServer`."""

    token: str | None
    user: str
    injections: list[Injection]
    holds: list[Hold]
    deny_rules: list[DenyRule]
    _watchers: set[Watcher]
    _stalled: bool
    _closing: trio.Event

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

    def hold(self, method: str, path_regex: str, *, times: int | None = 1) -> Hold:
        """Hold the next ``times`` (None: all, until released) requests whose method
        matches (``*`` for any) and whose path matches ``re.search(path_regex)``: each waits,
        received but unanswered, until ``hold.release()`` (or the server stops), then is
        served as usual against the state of that moment. Holds come before injections."""
        rule = Hold(method.upper(), path_regex, times)
        self.holds.append(rule)
        return rule

    async def _wait_hold(self, rule: Hold) -> None:
        rule.arrived += 1
        self._notify()
        async with trio.open_nursery() as nursery:

            async def until(event: trio.Event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(until, rule.released)
            nursery.start_soon(until, self._closing)

    def hold_watch_headers(self, plural: str | None = None) -> Injection:
        """New watches (of ``plural``, or all) get no response headers at all, until the
        returned rule is removed (``clear_injections``): each waits until its client
        goes away. Lists and writes are served as usual."""
        return self.inject("GET", rf"/{plural or '[^/]+'}$", status=200, hang=True, times=None,
                           query_contains="watch=true")

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

    async def _answer_injection(self, rule: Injection, rec: RecordedRequest,
                                receive: Receive, send: Send) -> None:
        rec.status = rule.status
        if rule.hang:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_disconnect, receive, nursery.cancel_scope)
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
            await respond_raw(send, rule.status, rule.body, ctype, headers)
        elif rule.body is not None:
            await respond_json(send, rule.status, rule.body, headers)
        else:
            await respond_json(send, rule.status, status_body(rule.status), headers)

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


__all__ = ["DEFAULT_USER", "DenyRule", "FaultControl", "Hold", "Injection"]
