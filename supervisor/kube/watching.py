"""List-then-watch of one resource in one namespace: :class:`Informer`."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Generic, Protocol, TypeVar

import msgspec
import trio

from supervisor.backoff import Backoff
from supervisor.kube.client import KubeClient, decode
from supervisor.kube.errors import (
    ApiError,
    DecodeError,
    Forbidden,
    Gone,
    KubeError,
    NotFound,
    api_error,
)
from supervisor.kube.models import PartialMeta, PartialObject, RawWatchEvent, Resource, Status
from supervisor.logs import get_logger

__all__ = [
    "Informer",
    "InformerHandler",
    "WatchTuning",
    "is_preflight_matter",
    "is_too_large_resource_version",
]

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

log = get_logger("kube.watch")

# metav1.CauseTypeResourceVersionTooLarge, and the cause message servers 1.17-1.18.5 sent
# without that type (storage.NewTooLargeResourceVersionError).
RV_TOO_LARGE_CAUSE = "ResourceVersionTooLarge"
_RV_TOO_LARGE_TEXT = "Too large resource version"


@dataclass(frozen=True)
class WatchTuning:
    """Timings of list/watch; the defaults suit a real cluster, tests shrink them.

    ``inactivity_s`` must exceed the server's bookmark interval (about a minute
    on kube-apiserver) or healthy idle streams are cut.
    """

    timeout_s: int = 240
    inactivity_s: float = 120.0
    backoff_initial_s: float = 0.8
    backoff_max_s: float = 30.0
    page_size: int = 500


class InformerHandler(Protocol[T_contra]):
    """What an :class:`Informer` tells its owner. Callbacks must not block for long."""

    async def on_list(self, items: Mapping[str, T_contra], skewed: set[str]) -> None:
        """The complete current set (after the first list and every relist)."""

    def on_upsert(self, obj: T_contra, name: str) -> None:
        """An object was added or modified."""

    def on_delete(self, name: str) -> None:
        """An object was deleted."""

    def on_skewed(self, name: str, error: DecodeError) -> None:
        """An object (``name`` may be ``""`` when unreadable) failed to decode; it is skipped."""


def is_preflight_matter(exc: KubeError) -> bool:
    """True for failures a retry loop cannot heal: back to the preflight."""
    return isinstance(exc, Forbidden | NotFound) or (
        isinstance(exc, DecodeError) and not isinstance(exc, _LineError)
    )


def is_too_large_resource_version(exc: KubeError) -> bool:
    """True for "Too large resource version": asked for an RV newer than the server's.

    As client-go's ``isTooLargeResourceVersionError``: the ``ResourceVersionTooLarge`` cause
    in the ``Status``. It is read from the error's body: the response's, or the watch
    ``ERROR`` event's object. Servers before 1.18.6 send a ``Timeout`` whose cause or
    message says so.
    """
    if not isinstance(exc, ApiError):
        return False
    try:
        status = decode(exc.body, Status) if exc.body else Status()
    except DecodeError:
        status = Status()  # no causes to read
    return any(c.reason == RV_TOO_LARGE_CAUSE for c in status.causes) or (
        exc.reason == "Timeout" and (any(c.message == _RV_TOO_LARGE_TEXT for c in status.causes)
                                     or _RV_TOO_LARGE_TEXT in exc.message))


class _LineError(DecodeError):
    """A watch line that is not a JSON event at all: a broken stream, not a skewed object."""


@dataclass(eq=False)
class Informer(Generic[T]):
    """Keeps ``handler`` in step with one resource in one namespace."""

    client: KubeClient
    resource: Resource
    item_type: type[T]
    namespace: str
    handler: InformerHandler[T]
    _: KW_ONLY
    name_of: Callable[[T], str]
    tuning: WatchTuning = WatchTuning()
    on_restart: Callable[[], None] = lambda: None
    on_failure: Callable[[KubeError], None] = lambda exc: None
    on_open: Callable[[], None] = lambda: None
    on_close: Callable[[], None] = lambda: None
    label_selector: str | None = None
    rng: random.Random | None = None

    def __post_init__(self) -> None:
        self._backoff = Backoff(self.tuning.backoff_initial_s, self.tuning.backoff_max_s, self.rng)
        self.resource_version: str | None = None
        self._listed_version: str | None = None  # the RV the last list returned
        self.lists = 0
        self.watches_with_events = 0
        self._productive = False  # the current (or last) watch stream delivered a line

    async def _sleep_backoff(self, exc: KubeError) -> None:
        self.on_restart()
        self.on_failure(exc)
        delay = self._backoff.next(at_least=exc.retry_after)
        log.warning("watch failed; retrying", resource=str(self.resource),
                    namespace=self.namespace, error=str(exc), delay_s=round(delay, 3))
        await trio.sleep(delay)

    async def run(self) -> None:
        """List, then watch, forever; never returns (cancel it to stop).

        1. **List** every object, paged (``limit=page_size``), items decoded one at a time.
           An item that does not decode is told to ``on_skewed`` and skipped; the list
           goes on. ``on_list`` gets the complete set before any watch event.
        2. **Watch** from the list's resourceVersion, with bookmarks and the server's
           ``timeoutSeconds``. Each line must come within ``inactivity_s``, else the stream
           stalled. A skewed event is reported and skipped. Bookmarks only advance the
           position. An event not newer than the position is a replay: logged, never
           handed on (it would roll the handler back).
        3. A stream the server ends is re-opened at once from the last resourceVersion.
           ``410 Gone`` means **relist**. So does ``ResourceVersionTooLarge`` (an ``ERROR``
           event, or a 504 ``Timeout``). The server's RV went backwards (etcd restored);
           watching from ours would see nothing until it caught up. As client-go's reflector
           does. When that RV came straight from a list, the relist waits a backoff first,
           so the loop cannot run hot. Any other failure (transport, stall, timeout,
           oversized line, 5xx, 429) waits a backoff, then re-watches. The backoff is 0.8 s
           doubling to 30 s with jitter, at least ``Retry-After``. A stream that delivered a
           line resets the backoff first.
        4. ``403``/``404`` and an undecodable list envelope are not this loop's to fix (RBAC,
           namespace, CRD, schema): they propagate, so the caller goes back to its preflight.

        Every relist and reconnect after a failure calls ``on_restart`` (the
        ``fanout_watch_restarts`` metric). A failure that waits a backoff is told to
        ``on_failure`` first. ``on_open`` is called when a watch's headers came and
        ``on_close`` when that watch ended, however (a normal end, a failure, a relist,
        cancellation), so the owner can say whether a watch is open. A re-open after a
        normal end or relist is no failure, but none is open until its headers come.
        """
        while True:
            if self.resource_version is None:
                try:
                    await self._list()
                except KubeError as exc:
                    if is_preflight_matter(exc):
                        raise
                    await self._sleep_backoff(exc)
                    continue
            try:
                received = await self._watch_once()
            except Gone:
                log.info("watch resourceVersion expired; relisting",
                         resource=str(self.resource), namespace=self.namespace)
                self.resource_version = None
                self.on_restart()
                continue
            except KubeError as exc:
                if is_too_large_resource_version(exc):
                    await self._relist_too_large(exc)
                    continue
                if is_preflight_matter(exc):
                    raise
                if self._productive:
                    # The stream delivered before it was cut: this is a new outage, not
                    # the next failure of the last one (kube-rs resets after a good event).
                    self._backoff.reset()
                await self._sleep_backoff(exc)
                continue
            if received:
                self._backoff.reset()
            else:
                # Ended normally without a single line: a server (or proxy) closing
                # streams at once must not turn this loop hot.
                await trio.sleep(self._backoff.next())

    async def _relist_too_large(self, exc: KubeError) -> None:
        """Drop the RV the server no longer has (it went backwards) and relist."""
        from_list = self.resource_version == self._listed_version
        delay = self._backoff.next() if from_list else 0.0
        log.warning("watch resourceVersion is newer than the server's (its store was "
                    "restored?); relisting", kind=self.resource.kind,
                    resource=str(self.resource), namespace=self.namespace,
                    resource_version=self.resource_version, error=str(exc),
                    delay_s=round(delay, 3))
        self.resource_version = None
        self.on_restart()
        if delay:
            await trio.sleep(delay)

    async def _list(self) -> None:
        items: dict[str, T] = {}
        skewed: set[str] = set()
        continue_token: str | None = None
        while True:
            page = await self.client.list(
                self.resource, self.namespace, msgspec.Raw,
                limit=self.tuning.page_size, continue_token=continue_token,
                label_selector=self.label_selector,
            )
            for raw in page.items:
                obj = self._decode_object(raw, skewed)
                if obj is not None:
                    items[self.name_of(obj)] = obj
            continue_token = page.metadata.continue_
            if not continue_token:
                break
        self.lists += 1
        self._backoff.reset()
        await self.handler.on_list(items, skewed)
        self.resource_version = self._listed_version = page.metadata.resource_version

    def _decode_object(self, raw: msgspec.Raw, skewed: set[str]) -> T | None:
        try:
            return decode(bytes(raw), self.item_type)
        except DecodeError as exc:
            name = _meta(raw).name
            if name:
                skewed.add(name)
            self.handler.on_skewed(name, exc)
            return None

    async def _watch_once(self) -> bool:
        """One watch request until the server ends it; True when any line arrived."""
        assert self.resource_version is not None
        self._productive = False
        async with self.client.watch(
            self.resource, self.namespace,
            resource_version=self.resource_version,
            timeout_s=self.tuning.timeout_s,
            inactivity_s=self.tuning.inactivity_s,
            label_selector=self.label_selector,
        ) as stream:
            self.on_open()
            try:
                while (line := await stream.next_line()) is not None:
                    if not self._productive:
                        self._productive = True
                        self.watches_with_events += 1
                    self.handle_line(line)
            finally:
                self.on_close()
        return self._productive

    def handle_line(self, line: bytes) -> None:
        """One line of the watch stream: an event handed on, a bookmark or a replay taken in,
        or a refusal raised. A refusal is a :class:`~supervisor.kube.errors.KubeError`: a
        line that is not an event, or an ``ERROR`` event as its status. Any bytes end in one
        of those, never in another exception.
        """
        try:
            event = decode(line, RawWatchEvent)
        except DecodeError as exc:
            raise _LineError(f"undecodable watch line: {exc}") from exc
        if event.type == "ERROR":
            try:
                status = decode(bytes(event.object), Status)
            except DecodeError as exc:
                raise _LineError(f"undecodable watch ERROR event: {exc}") from exc
            # 410 here is the usual way a watch learns its resourceVersion expired; the
            # Status goes along as the body (its causes tell "too large resource version").
            raise api_error(status.code or 500, status.reason, status.message,
                            body=bytes(event.object), method="WATCH",
                            path=self.resource.collection_path(self.namespace))
        meta = _meta(event.object)
        rv = meta.resource_version
        if event.type in ("ADDED", "MODIFIED", "DELETED") and not _after(
                rv, self.resource_version):
            # A watch from RV X only ever sends what happened after X: an older event is a
            # replay (a proxy, a misbehaving server) and would roll the handler back.
            log.warning("watch event not newer than the stream's resourceVersion; ignored",
                        resource=str(self.resource), type=event.type, name=meta.name or None,
                        event_resource_version=rv, resource_version=self.resource_version)
            return
        if event.type == "DELETED":
            if meta.name:
                self.handler.on_delete(meta.name)
        elif event.type in ("ADDED", "MODIFIED"):
            skewed: set[str] = set()
            obj = self._decode_object(event.object, skewed)
            if obj is not None:
                self.handler.on_upsert(obj, self.name_of(obj))
        elif event.type != "BOOKMARK":  # a bookmark only advances the position
            log.warning("unknown watch event type; ignored", type=event.type,
                        resource=str(self.resource))
        self.resource_version = rv or self.resource_version


def _after(rv: str, position: str | None) -> bool:
    """Is ``rv`` newer than the stream's ``position``? (True when either is not an integer.)

    kube-apiserver's resourceVersions are etcd revisions; anything else is not compared.
    """
    try:
        return int(rv) > int(position or "")
    except ValueError:
        return True


def _meta(raw: msgspec.Raw) -> PartialMeta:
    """The object's metadata as far as it decodes (empty when it does not)."""
    try:
        return decode(bytes(raw), PartialObject).metadata
    except DecodeError:
        return PartialMeta()
