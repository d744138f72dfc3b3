"""A small Kubernetes API client for trio, on httpcore's pool (:mod:`supervisor.kube.transport`).

Contract:

- Configuration comes from :mod:`supervisor.kube.config` (the official
  loaders), loaded lazily on the first request, in a worker thread. A load
  failure surfaces from that request as
  :class:`~supervisor.kube.errors.KubeConfigError`; the next request tries
  again, so a kubeconfig fixed on disk heals without a restart.
- TLS is verified against the configured CA; client certificates are used
  when configured.
- The bearer token is refreshed every ``token_refresh_s`` and, after a
  ``401``, re-read by running the whole loader again, and the request is
  retried once (:mod:`supervisor.kube.credentials`: one reload for concurrent
  ``401`` s; worker threads that a cancellation abandons).
- Every failure is one of :mod:`supervisor.kube.errors`, chained with
  ``from`` to the httpx or msgspec error.
- Bodies decode with msgspec into the caller's Struct type
  (:func:`~supervisor.kube.wire.decode`): a body of another shape raises
  :class:`~supervisor.kube.errors.SchemaSkew`, malformed JSON
  :class:`~supervisor.kube.errors.DecodeError`.
- Deadlines: every response's headers arrive within ``timeout_s``, a watch's
  included (else :class:`~supervisor.kube.errors.TimedOut`); a body is read
  within ``timeout_s`` plus 1 s per 256 KiB, and up to
  :data:`~supervisor.kube.wire.MAX_RESPONSE_BYTES` (more is
  :class:`~supervisor.kube.errors.TooLargeResponse`, refused unread).
- Watches are streamed line by line with a client-side inactivity deadline and
  a bound on one line (:class:`~supervisor.kube.wire.WatchStream`); the caller
  decodes each event on its own.

- A client-side rate limit (:class:`TokenBucket`, client-go's QPS and Burst) paces
  every request when ``qps`` is given; a watch counts once, when it opens. Its
  defaults are a safety net, not the pace: the API server protects itself
  (API Priority and Fairness answers 429 with ``Retry-After``), and the first
  429 holds every request of this client until its ``Retry-After`` has passed
  (:attr:`KubeClient.paused_s` adds those waits up).

Not retried here: 409, 410, 429 and 5xx are the caller's decision (the
watchers relist or back off, the reconcilers requeue).
"""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import httpx
import msgspec
import trio

from supervisor.kube.config import CREDENTIALS_DEADLINE_S, KubeSettings, load_settings_async
from supervisor.kube.credentials import Credentials
from supervisor.kube.errors import KubeConfigError, NotFound, TimedOut, transport_error
from supervisor.kube.models import ObjectList, PartialObject, Resource
from supervisor.kube.transport import Transport
from supervisor.kube.wire import (
    MAX_RESPONSE_BYTES,
    RequestBody,
    ResourceList,
    ResponseBody,
    WatchStream,
    decode,
    list_type,
    raise_api_error,
    retry_after,
)
from supervisor.logs import get_logger
from supervisor.threads import in_thread

__all__ = ["APPLY_PATCH", "KubeClient", "TokenBucket", "WatchStream", "decode"]

T = TypeVar("T")

log = get_logger("kube")

APPLY_PATCH = "application/apply-patch+yaml"
_JSON = "application/json"
# Kept as they are in a path: what Kubernetes names and our paths are made of.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"
# What httpx.AsyncClient sent by default, as before (the API server's audit log
# and managedFields of a write without fieldManager name the user agent).
_HEADERS = [(b"Accept", _JSON.encode()), (b"Accept-Encoding", b"gzip, deflate"),
            (b"User-Agent", f"python-httpx/{httpx.__version__}".encode())]


class TokenBucket:
    """``qps`` tokens a second, at most ``burst`` stored; starts full (client-go's QPS, Burst).

    :meth:`acquire` returns at once while tokens are left, then paces callers at
    ``qps`` a second in the order they asked (a trio.Lock is FIFO). It never
    fails: a caller cancelled while waiting gives its turn up.
    """

    def __init__(self, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._stamp: float | None = None
        self._lock = trio.Lock()
        self.waited_s = 0.0  # total time callers spent waiting (for tests and metrics)

    def _refill(self) -> None:
        now = trio.current_time()
        if self._stamp is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now

    async def acquire(self) -> None:
        """Take one token, waiting for it when the bucket is empty."""
        async with self._lock:
            self._refill()
            if self._tokens < 1.0:
                wait = (1.0 - self._tokens) / self.qps
                self.waited_s += wait
                await trio.sleep(wait)
                self._refill()
            self._tokens -= 1.0


class KubeClient:
    """One connection pool to one API server; share it between watchers.

    ``settings`` is a coroutine function returning fresh :class:`KubeSettings`
    (called on first use and after a 401). Use :meth:`from_kubeconfig` in
    production. Call :meth:`aclose` when done.
    """

    def __init__(
        self,
        settings: Callable[[], Awaitable[KubeSettings]],
        *,
        timeout_s: float = 10.0,
        token_refresh_s: float = 60.0,
        max_connections: int = 32,
        qps: float | None = None,
        burst: int = 1,
    ) -> None:
        self._load = settings
        self.limiter = TokenBucket(qps, max(1, burst)) if qps else None
        self._timeout = httpx.Timeout(timeout_s)
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._lock = trio.Lock()
        self._http: Transport | None = None
        self._settings: KubeSettings | None = None
        self._credentials = Credentials(settings, refresh_s=token_refresh_s, lock=self._lock)
        self._closed = False
        self._resume_at = -math.inf  # trio time before which no request is sent (a 429)
        self.paused_s = 0.0

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, **kwargs: Any) -> KubeClient:
        """A client configured by ``kubeconfig`` (None: in-cluster, else the default file)."""
        return cls(functools.partial(load_settings_async, kubeconfig), **kwargs)

    @property
    def token_reloads(self) -> int:
        """How many times the credentials were re-read after a 401."""
        return self._credentials.reloads

    # -- lifecycle --------------------------------------------------------------

    async def _ensure(self) -> Transport:
        if self._http is not None:
            return self._http
        async with self._lock:
            if self._http is None:
                if self._closed:
                    raise KubeConfigError("the Kubernetes client is closed")
                settings = await self._load()
                # Abandoned on cancel: the thread only reads files; its context is dropped.
                verify = await in_thread(settings.ssl_context, dependency="kube",
                                         deadline_s=CREDENTIALS_DEADLINE_S,
                                         what="the Kubernetes TLS settings")
                try:
                    self._http = Transport(settings.host, verify, proxy=settings.proxy,
                                           max_connections=self._max_connections)
                # RuntimeError: httpcore's socks5 without socksio installed.
                except (ValueError, ImportError, RuntimeError, httpx.InvalidURL) as exc:
                    raise KubeConfigError(f"cannot use {settings.host} (proxy-url "
                                          f"{_without_password(settings.proxy)}): {exc}") from exc
                self._settings = settings
                self._credentials.adopt(settings)
                log.info("kubernetes client configured", host=settings.host, source=settings.source)
            return self._http

    async def aclose(self) -> None:
        """Close the connection pool. Idempotent; later requests fail with KubeConfigError."""
        self._closed = True
        self._credentials.drop_refresh()
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    # -- requests ---------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        content: bytes | None = None,
        content_type: str | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """Send one request; the response's headers within ``timeout_s``, its body unread."""
        http = await self._ensure()
        if self.limiter is not None:
            await self.limiter.acquire()
        now = trio.current_time()
        if now < self._resume_at:
            self.paused_s += self._resume_at - now
            await trio.sleep_until(self._resume_at)
        server_name = self._settings.tls_server_name if self._settings is not None else None
        target = quote(path, safe=_PATH_SAFE)
        if params:
            target += "?" + urlencode(params, quote_via=quote)
        fixed = [(b"Host", http.host_header), *_HEADERS]
        if content is not None:
            fixed += [(b"Content-Type", (content_type or _JSON).encode()),
                      (b"Content-Length", b"%d" % len(content))]
        for attempt in (0, 1):
            authorization = await self._credentials.current()
            headers = fixed if not authorization else [
                *fixed, (b"Authorization", authorization.encode())]
            # httpx times each read, not the whole head: a server that never sends its
            # headers (or a watch's) would hold this request forever without this scope.
            with trio.move_on_after(self._timeout_s) as scope:
                try:
                    response = await http.send(
                        method.encode(), target.encode(), headers,
                        RequestBody(content) if content is not None else None,
                        timeout or self._timeout, server_name)
                except httpx.HTTPError as exc:
                    source = self._settings.source if self._settings else "the kubeconfig"
                    raise transport_error(
                        f"{method} {path}", exc, certificate_hint=f"the CA of {source}",
                        timed_out=isinstance(exc, httpx.TimeoutException)) from exc
            if scope.cancelled_caught:
                raise TimedOut(f"{method} {path}: no response headers within "
                               f"{self._timeout_s:g} s")
            if response.status_code == 401 and attempt == 0:
                await response.aclose()
                await self._credentials.reload_after_401(authorization)
                continue
            # A 429: nothing more is sent until its Retry-After (capped) has passed.
            wait = retry_after(response) if response.status_code == 429 else None
            if wait is not None and wait > 0:
                self._resume_at = max(self._resume_at, trio.current_time() + wait)
            if response.status_code >= 400:
                await raise_api_error(response, method, path, self._timeout_s)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def request(
        self,
        method: str,
        path: str,
        type_: type[T],
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = _JSON,
    ) -> T:
        """One request; the JSON body (``body`` encoded by msgspec) decoded into ``type_``."""
        content = msgspec.json.encode(body) if body is not None else None
        response = await self._send(method, path, params=params, content=content,
                                    content_type=content_type)
        body = ResponseBody(response, f"{method} {path}")
        try:
            raw = await body.read(MAX_RESPONSE_BYTES, self._timeout_s)
        finally:
            await body.aclose()
        return decode(raw, type_)

    async def list(
        self,
        resource: Resource,
        namespace: str,
        item_type: type[T],
        *,
        limit: int | None = None,
        continue_token: str | None = None,
        label_selector: str | None = None,
    ) -> ObjectList[T]:
        """One page of a list; ``item_type`` ``msgspec.Raw`` defers item decoding."""
        params = _given(limit=None if limit is None else str(limit), labelSelector=label_selector,
                        **{"continue": continue_token})
        return await self.request(
            "GET", resource.collection_path(namespace), list_type(item_type), params=params
        )

    async def get(self, resource: Resource, namespace: str, name: str, type_: type[T]) -> T:
        return await self.request("GET", resource.object_path(namespace, name), type_)

    async def apply(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        body: Mapping[str, Any],
        *,
        field_manager: str,
        force: bool = False,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Server-side apply (``force`` only when asked); the object returned, as a map.
        JSON is valid YAML, so the body goes as apply-patch+yaml."""
        params = _given(fieldManager=field_manager, force="true" if force else None)
        return await self.request(
            "PATCH", resource.object_path(namespace, name, subresource), dict[str, Any],
            params=params, body=body, content_type=APPLY_PATCH,
        )

    async def create_object(
        self,
        resource: Resource,
        namespace: str,
        body: Mapping[str, Any],
        *,
        field_manager: str,
    ) -> dict[str, Any]:
        """Create (POST): an existing object of that name is a 409 ``AlreadyExists``, untouched."""
        return await self.request(
            "POST", resource.collection_path(namespace), dict[str, Any],
            params={"fieldManager": field_manager}, body=body,
        )

    async def find(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """The object ``name`` as a map, or None: a list by name (needs list, not get)."""
        found = await self.request(
            "GET", resource.collection_path(namespace), list_type(dict[str, Any]),
            params={"fieldSelector": f"metadata.name={name}"},
        )
        return found.items[0] if found.items else None

    async def serves(self, resource: Resource) -> bool:
        """Does the server serve ``resource`` (its group/version's discovery lists it)?"""
        try:
            found = await self.request("GET", resource.group_version_path(), ResourceList)
        except NotFound:
            return False
        return any(item.name == resource.plural for item in found.resources)

    async def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete with background propagation; False when it was already gone."""
        try:
            await self.request(
                "DELETE", resource.object_path(namespace, name), PartialObject,
                body={"kind": "DeleteOptions", "apiVersion": "v1",
                      "propagationPolicy": "Background"},
            )
        except NotFound:
            return False
        return True

    @asynccontextmanager
    async def watch(
        self,
        resource: Resource,
        namespace: str,
        *,
        resource_version: str,
        timeout_s: int,
        inactivity_s: float,
        label_selector: str | None = None,
    ) -> AsyncIterator[WatchStream]:
        """Watch from ``resource_version`` with bookmarks; yields its :class:`WatchStream`."""
        params = _given(watch="true", allowWatchBookmarks="true", timeoutSeconds=str(timeout_s),
                        labelSelector=label_selector)
        params["resourceVersion"] = resource_version  # sent even when empty
        path = resource.collection_path(namespace)
        # The headers within timeout_s (_send); then no httpx read timeout: the stream's
        # own inactivity deadline decides.
        response = await self._send(
            "GET", path, params=params, timeout=httpx.Timeout(self._timeout_s, read=None),
        )
        stream = WatchStream(response, inactivity_s, path)
        try:
            yield stream
        finally:
            # Shielded and bounded: this also runs while we are being cancelled.
            with trio.move_on_after(1.0, shield=True):
                await stream.aclose()


def _given(**params: str | None) -> dict[str, str]:
    """The parameters (query, headers) that have a value: None or empty is not sent."""
    return {key: value for key, value in params.items() if value}


def _without_password(proxy: str | None) -> str:
    """A proxy URL as an error shows it: its credentials (all before the last ``@``) masked."""
    if proxy is None:
        return "none"
    at = proxy.rfind("@")
    if at < 0:
        return proxy
    scheme = proxy[:proxy.find("://") + 3] if "://" in proxy[:at] else ""
    return f"{scheme}***@{proxy[at + 1:]}"
