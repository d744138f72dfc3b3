"""The wire side of the Kubernetes client: decoding bodies, request bodies, watch lines."""

from __future__ import annotations

import datetime as _dt
import email.utils
import functools
import math
from typing import Any, NoReturn, TypeVar, cast

import httpx
import msgspec
import trio

from supervisor.bounds import DETAIL_BYTES, TooLarge, check_size, cut
from supervisor.kube.errors import (
    DecodeError,
    SchemaSkew,
    StreamStalled,
    TimedOut,
    TooLargeResponse,
    TransportError,
    api_error,
    transport_error,
)
from supervisor.kube.models import ObjectList, Status

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "MAX_RESPONSE_BYTES",
    "MAX_RETRY_AFTER_S",
    "MAX_WATCH_LINE_BYTES",
    "MIN_BODY_RATE",
    "RequestBody",
    "ResourceList",
    "ResponseBody",
    "WatchStream",
    "decode",
    "list_type",
    "raise_api_error",
    "retry_after",
]

T = TypeVar("T")

MAX_RETRY_AFTER_S = 30.0  # the longest wait one 429's Retry-After asks of us
#: A response body: a list page (500 items) of objects etcd keeps under 1.5 MiB each is
#: far below this in practice; more is refused unread.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: An error answer is read this far for its Status; the rest is dropped.
MAX_ERROR_BODY_BYTES = 64 * 1024
#: One watch line is one event: one object (etcd keeps at most 1.5 MiB) and its envelope.
MAX_WATCH_LINE_BYTES = 8 * 1024 * 1024
#: A body's deadline grows by 1 s per this many bytes read (256 KiB/s).
MIN_BODY_RATE = 256 * 1024


@functools.lru_cache(maxsize=128)
def _decoder(type_: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(type_)


def decode(body: bytes, type_: type[T]) -> T:
    """Decode ``body`` into ``type_``; SchemaSkew on a shape mismatch, DecodeError on bad JSON."""
    try:
        return cast(T, _decoder(cast(Any, type_)).decode(body))
    except msgspec.ValidationError as exc:  # subclasses msgspec.DecodeError: first
        message = str(exc)
        _, sep, where = message.rpartition(" - at `")
        raise SchemaSkew(message, path=where.rstrip("`") if sep else "") from exc
    except msgspec.DecodeError as exc:
        raise DecodeError(f"malformed JSON: {exc}") from exc


def list_type(item_type: type[T]) -> type[ObjectList[T]]:
    return cast("type[ObjectList[T]]", ObjectList[item_type])  # type: ignore[valid-type]


def retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` (seconds, or an HTTP date) in seconds from now; None if absent or bad.

    At most :data:`MAX_RETRY_AFTER_S`.
    A server asking for hours is not believed: the client's hold, the requeue and the
    watcher's backoff all wait for this one figure.
    """
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:  # an HTTP-date (RFC 9110): a proxy may send one
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, OverflowError):  # neither: the caller's backoff applies
            return None
        if when.tzinfo is None:  # "-0000": UTC, as HTTP dates are
            when = when.replace(tzinfo=_dt.UTC)
        seconds = (when - _dt.datetime.now(_dt.UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None  # "inf" would put the retry off forever: the caller's backoff applies
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


async def raise_api_error(response: httpx.Response, method: str, path: str,
                          timeout_s: float) -> NoReturn:
    """Raise the refusal ``response`` carries (status >= 400) as :func:`~.errors.api_error`.

    It carries ``Retry-After`` and the ``Status`` body's reason and message (or the start of
    a body that is not one). The response is closed. The body is read up to
    :data:`MAX_ERROR_BODY_BYTES` within ``timeout_s``; the message is cut to
    :data:`~supervisor.bounds.DETAIL_BYTES`.
    """
    body_reader = ResponseBody(response, f"{method} {path}")
    try:
        body = await body_reader.read(MAX_ERROR_BODY_BYTES, timeout_s, truncate=True)
    except (TransportError, TooLargeResponse):
        body = b""
    finally:
        await body_reader.aclose()
    reason = message = ""
    try:
        status = msgspec.json.decode(body, type=Status)
        reason, message = cut(status.reason, 128), cut(status.message, DETAIL_BYTES)
    except msgspec.DecodeError:
        message = body[:200].decode("utf-8", "replace").strip()
    raise api_error(
        response.status_code, reason, message, body=body, method=method, path=path,
        retry_after=retry_after(response),
    )


class RequestBody(httpx.AsyncByteStream):
    """A request body whose iterator is an object, not an async generator.

    httpx wraps ``content=bytes`` in a stream whose ``__aiter__`` is an async generator. A
    request cancelled mid-send abandons it, and trio's GC hook then warns
    (encode/httpx#3686). A plain iterator has nothing to finalise.
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._sent = False

    def __aiter__(self) -> RequestBody:
        self._sent = False
        return self

    async def __anext__(self) -> bytes:
        if self._sent:
            raise StopAsyncIteration
        self._sent = True
        return self._data


class _ResourceName(msgspec.Struct):
    name: str


class ResourceList(msgspec.Struct):
    """Discovery's ``APIResourceList``: only the resource names are read."""

    resources: list[_ResourceName] = []


class ResponseBody:
    """The body of one streamed response, read within its bounds.

    :meth:`read` returns at most ``limit`` bytes. More is
    :class:`~supervisor.kube.errors.TooLargeResponse`, or cut off with ``truncate``.
    The deadline is ``timeout_s`` plus 1 s per :data:`MIN_BODY_RATE` bytes read so far:
    a large list over a slow link finishes, a server dribbling a body cannot hold us
    forever. httpx's read timeout bounds each silence. Passed:
    :class:`~supervisor.kube.errors.TimedOut`.
    """

    def __init__(self, response: httpx.Response, where: str) -> None:
        self._response = response
        # A body sent as it is (no Content-Encoding: all but a large list's) is read
        # straight from its stream, not through httpx's decoding and chunking layers
        # (a watch is a chunk an event).
        plain = "content-encoding" not in response.headers
        self._chunks = (response.stream.__aiter__()
                        if plain and isinstance(response.stream, httpx.AsyncByteStream)
                        else response.aiter_bytes())
        self._where = where
        self._ended = False

    async def aclose(self) -> None:
        """Finish the byte iterator, then close the response.

        httpx's body iterators are nested async generators. Abandoned half-way, trio's GC
        hook finalises them with a ResourceWarning (encode/httpx#3686). Pulling once more
        inside an already-cancelled scope raises Cancelled at their innermost checkpoint
        instead, which finishes every level properly.
        """
        if not self._ended:
            with trio.CancelScope() as scope:
                scope.cancel()
                for _ in range(10_000):  # bounded: already-buffered chunks drain first
                    try:
                        await self._chunks.__anext__()
                    except (StopAsyncIteration, httpx.HTTPError):
                        break
            self._ended = True
        await self._response.aclose()

    async def _chunk(self) -> bytes | None:
        """The next chunk, or None at the end of the body."""
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            self._ended = True
            return None
        except httpx.HTTPError as exc:
            raise transport_error(self._where, exc,
                                  timed_out=isinstance(exc, httpx.TimeoutException)) from exc

    async def read(self, limit: int, timeout_s: float, *, truncate: bool = False) -> bytes:
        """The whole body (see the class doc); the response stays open (call :meth:`aclose`)."""
        chunks: list[bytes] = []
        total = 0
        started = trio.current_time()
        with trio.CancelScope(deadline=started + timeout_s) as scope:
            while (chunk := await self._chunk()) is not None:
                try:
                    check_size(self._where, total + len(chunk), limit)
                except TooLarge as exc:
                    if truncate:
                        chunks.append(chunk[: limit - total])
                        break
                    raise TooLargeResponse(f"{exc} (the body is refused unread)") from exc
                total += len(chunk)
                chunks.append(chunk)
                scope.deadline = started + timeout_s + total / MIN_BODY_RATE
            return b"".join(chunks)
        raise TimedOut(f"{self._where}: {total} bytes of the body in "
                       f"{trio.current_time() - started:.1f} s, the deadline passed")


class WatchStream(ResponseBody):
    """The lines of one watch response, each within ``inactivity_s`` of the previous.

    :meth:`next_line` returns one non-empty line (one JSON event), or None when the server
    ended the stream (its ``timeoutSeconds`` elapsed). No bytes for ``inactivity_s`` raises
    :class:`StreamStalled`. A half-open connection behind a load balancer never errors on
    its own; bookmarks keep a healthy stream from such silence. A line over ``max_line``
    (:data:`MAX_WATCH_LINE_BYTES`) is :class:`~supervisor.kube.errors.TooLargeResponse` as
    soon as its bytes pass the bound, never held whole.
    """

    def __init__(self, response: httpx.Response, inactivity_s: float, where: str, *,
                 max_line: int = MAX_WATCH_LINE_BYTES) -> None:
        super().__init__(response, f"watch {where}")
        self._max_line = max_line
        self._buffer = bytearray()
        self._inactivity_s = inactivity_s
        self._scanned = 0  # bytes of the buffer known to hold no newline

    async def next_line(self) -> bytes | None:
        while True:
            index = self._buffer.find(b"\n", self._scanned)
            try:  # the line so far, or the whole line: never more than one chunk past it
                check_size(f"{self._where}: one line", len(self._buffer) if index < 0 else index,
                           self._max_line)
            except TooLarge as exc:
                self._buffer.clear()
                raise TooLargeResponse(f"{exc} (refused; the watch restarts)") from exc
            if index >= 0:
                line = bytes(self._buffer[:index])
                del self._buffer[: index + 1]
                self._scanned = 0
                if line.strip():
                    return line
                continue
            self._scanned = len(self._buffer)
            if self._ended:
                rest, self._buffer = bytes(self._buffer), bytearray()
                return rest if rest.strip() else None
            chunk: bytes | None = None
            with trio.move_on_after(self._inactivity_s) as scope:
                chunk = await self._chunk()
            if scope.cancelled_caught:
                raise StreamStalled(
                    f"{self._where}: nothing received for {self._inactivity_s:g} s"
                )
            if chunk:
                self._buffer += chunk
