"""The Kubernetes client's HTTP transport: httpcore's connection pool, used directly.

Why not ``httpx.AsyncClient.send``: a fan-out bulk is thousands of small
requests, and a py-spy profile of a 1,000-parent bulk on a real kube-apiserver
put most of the daemon's time in the layers above the wire: ``build_request``
parsing and merging each URL with the base URL, the cookie jar, the auth and
redirect flows, the response's bound stream. The API server needs none of them.

Contract of :class:`Transport`:

- :meth:`Transport.send` sends one request (``target``: the path and query,
  already encoded) on a pool of at most ``max_connections`` HTTP/1.1 keep-alive
  connections to the configured host (or through its proxy: ``http``/``https``
  with CONNECT, ``socks5`` when socksio is installed) and returns the
  ``httpx.Response`` with its body unread (streamed), as httpx would. The
  connection goes back to the pool when the response is closed (every caller
  closes it), read to its end; else it is closed. The direct pool is
  :class:`_Pool` (one host, last used first; httpcore's own, for any number of
  hosts, spent a tenth of the bulk's time choosing a connection).
- Failures are httpx's exceptions (the same classes httpx's own transport
  raises for httpcore's), chained ``from`` httpcore's, so callers and their
  messages are as with httpx (``supervisor.kube.errors.transport_error``).
- Timeouts are httpx's: ``connect``, each ``read`` (``None``: no read
  timeout, a watch), each ``write``, waiting for a ``pool`` slot.
- One write a request: the request's head and body are corked (held) until the
  connection's next read, the response's, and sent as one TLS record and one
  ``send`` (else each request is two of each).
"""

from __future__ import annotations

import functools
import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx
import trio

__all__ = ["Transport"]

# httpcore's exceptions as httpx's own transport maps them (most derived first).
_MAPPED: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextmanager
def _as_httpx() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for theirs, ours in _MAPPED:
            if isinstance(exc, theirs):
                raise ours(str(exc)) from exc
        raise



class _CorkedStream(httpcore.AsyncNetworkStream):
    """Writes held until the next read (or TLS start), then sent as one."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._held: list[bytes] = []
        self._timeout: float | None = None

    async def _flush(self) -> None:
        if self._held:
            data = b"".join(self._held)  # one buffer: itself, not a copy
            self._held.clear()
            await self._stream.write(data, self._timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            self._held.append(buffer)
            self._timeout = timeout

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._flush()
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._held.clear()
        await self._stream.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        await self._flush()
        return _CorkedStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _CorkedBackend(httpcore.AsyncNetworkBackend):
    """A network backend (httpcore's trio one), its streams corked (:class:`_CorkedStream`)."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend) -> None:
        self._backend = backend

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        return _CorkedStream(await self._backend.connect_tcp(
            host, port, timeout, local_address, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class _Body(httpx.AsyncByteStream):
    """httpcore's response stream, its failures as httpx's; ``closed`` is awaited on close."""

    def __init__(self, stream: Any,
                 closed: Callable[[], Awaitable[None]] | None = None) -> None:
        self._stream = stream
        self._closed = closed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        closed, self._closed = self._closed, None
        try:
            with _as_httpx():
                await self._stream.aclose()
        finally:
            if closed is not None:
                with trio.CancelScope(shield=True):
                    await closed()


class _Pool:
    """At most ``max_connections`` httpcore connections to one origin, the idle ones reused.

    Waiting for a free connection longer than the request's ``pool`` timeout is
    httpcore's PoolTimeout. A connection whose response ends unread, fails, or that
    the server closed while idle (httpcore's ``has_expired``) is not reused.
    """

    def __init__(self, origin: httpcore.Origin, *, max_connections: int,
                 ssl_context: ssl.SSLContext | None,
                 network_backend: httpcore.AsyncNetworkBackend) -> None:
        self._origin = origin
        self._ssl_context = ssl_context
        self._backend = network_backend
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[httpcore.AsyncHTTPConnection] = []
        self._busy: set[httpcore.AsyncHTTPConnection] = set()

    async def handle_async_request(
        self, request: httpcore.Request,
    ) -> tuple[httpcore.Response, Callable[[], Awaitable[None]]]:
        """The response, and what gives its connection back (call it once it is closed)."""
        timeout = request.extensions.get("timeout", {}).get("pool")
        with trio.move_on_after(math.inf if timeout is None else timeout) as waited:
            await self._slots.acquire()
        if waited.cancelled_caught:
            raise httpcore.PoolTimeout(f"no free connection within {timeout:g} s")
        connection: httpcore.AsyncHTTPConnection | None = None
        try:
            while self._idle:
                idle = self._idle.pop()
                if idle.is_idle() and not idle.has_expired():
                    connection = idle
                    break
                await idle.aclose()
            if connection is None:
                connection = httpcore.AsyncHTTPConnection(
                    self._origin, ssl_context=self._ssl_context,
                    network_backend=self._backend)
            self._busy.add(connection)
            response = await connection.handle_async_request(request)
        except BaseException:
            if connection is not None:
                self._busy.discard(connection)
                with trio.CancelScope(shield=True):
                    await connection.aclose()
            self._slots.release()
            raise
        return response, functools.partial(self._give_back, connection)

    async def _give_back(self, connection: httpcore.AsyncHTTPConnection) -> None:
        self._busy.discard(connection)
        self._slots.release()
        if connection.is_idle():
            self._idle.append(connection)
        else:
            await connection.aclose()

    async def aclose(self) -> None:
        connections = [*self._idle, *self._busy]
        self._idle.clear()
        self._busy.clear()
        for connection in connections:
            await connection.aclose()


class Transport:
    """One pool of connections to one API server (see the module doc)."""

    def __init__(self, host: str, verify: ssl.SSLContext | bool, *, max_connections: int,
                 proxy: str | None = None,
                 network_backend: httpcore.AsyncNetworkBackend | None = None) -> None:
        url = httpx.URL(host)
        self._scheme = url.raw_scheme
        self._host = url.raw_host
        self._port = url.port
        self._prefix = url.raw_path.rstrip(b"/")
        default_port = {b"http": 80, b"https": 443}.get(self._scheme)
        self.host_header = url.netloc  # the port only when not the scheme's default
        ssl_context = httpx.create_ssl_context(verify) if self._scheme == b"https" else None
        backend = _CorkedBackend(network_backend or httpcore.TrioBackend())
        self._pool: httpcore.AsyncConnectionPool | _Pool
        if proxy is None:
            origin = httpcore.Origin(self._scheme, self._host, self._port or default_port or 0)
            self._pool = _Pool(origin, max_connections=max_connections, ssl_context=ssl_context,
                               network_backend=backend)
        else:
            proxied = httpx.Proxy(proxy)  # its credentials out of the URL, as httpx does
            socks = proxied.url.scheme in ("socks5", "socks5h")
            self._pool = (httpcore.AsyncSOCKSProxy if socks else httpcore.AsyncHTTPProxy)(
                proxy_url=str(proxied.url), proxy_auth=proxied.raw_auth,
                ssl_context=ssl_context, max_connections=max_connections,
                max_keepalive_connections=max_connections, network_backend=backend)

    async def send(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                   stream: httpx.AsyncByteStream | None, timeout: httpx.Timeout,
                   sni_hostname: str | None = None) -> httpx.Response:
        """One request; the response with its body unread (see the module doc)."""
        extensions: dict[str, Any] = {"timeout": timeout.as_dict()}
        if sni_hostname:
            extensions["sni_hostname"] = sni_hostname
        request = httpcore.Request(
            method, httpcore.URL(scheme=self._scheme, host=self._host, port=self._port,
                                 target=self._prefix + target),
            headers=headers, content=stream, extensions=extensions)
        closed: Callable[[], Awaitable[None]] | None = None
        with _as_httpx():
            if isinstance(self._pool, _Pool):
                response, closed = await self._pool.handle_async_request(request)
            else:
                response = await self._pool.handle_async_request(request)
        return httpx.Response(response.status, headers=response.headers,
                              stream=_Body(response.stream, closed),
                              extensions=response.extensions)

    async def aclose(self) -> None:
        with _as_httpx():
            await self._pool.aclose()
