"""The two files that follow the active snapshot, the snapshot file and the signed cache.

:class:`SideSinks` writes them; :class:`SinkStatus` says how each is. Neither may ever
block serving. The reload hook (:mod:`supervisor.sinks.hook`) is the third sink.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from supervisor import reasons
from supervisor.logs import get_logger
from supervisor.sinks.atomic import write_atomic
from supervisor.status_doc import SinksReport, SinkState
from supervisor.streak import Streak
from supervisor.telemetry import Metrics
from supervisor.threads import FILE_IO_DEADLINE_S, ThreadDeadline, in_thread

if TYPE_CHECKING:
    from supervisor.revision.snapshot import Snapshot
    from supervisor.sinks.file import SnapshotFile
    from supervisor.sinks.hook import ReloadHook
    from supervisor.sinks.lkg import LastKnownGood
    from supervisor.sinks.lkg.statement import Statement
    from supervisor.sinks.state import Serving

__all__ = ["SideSinks", "SinkStatus"]

T = TypeVar("T")
log = get_logger("convergence")

# What a successful write left at a sink's paths: (device, inode, size, mtime,
# mode, owner) each. Mode and owner too: a chmod can make the snapshot file
# unreadable to its consumers, or the cache world-writable (a boot refuses it).
Fingerprint = tuple[tuple[int, int, int, int, int, int], ...]


def _print_of(st: os.stat_result) -> tuple[int, int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid)


def _fingerprint(paths: tuple[str, ...]) -> Fingerprint | None:
    """The files at ``paths`` as they are; None when one is missing or unreadable."""
    found = []
    for path in paths:
        try:
            found.append(_print_of(os.stat(path)))
        except OSError:
            return None
    return tuple(found)


class SinkStatus:
    """How each side sink is, for ``/status`` and the metric; outlives the loop's restarts.

    Made once per process: the convergence child makes a new loop at every start,
    and a restart must not forget that a sink is failing. A sink is ``ok``,
    ``failing`` while its failure streak lasts, or ``disabled`` when not configured
    (``/status`` ``sinks``, ``supervisor_sink_state``). Failures are logged once per
    streak, and the recovery once (:class:`~supervisor.streak.Streak`).
    """

    def __init__(self) -> None:
        #: The reload hook, when ``[hook].command`` is set (the daemon runs its task).
        self.hook: ReloadHook | None = None
        self._enabled = dict.fromkeys(reasons.SINKS, False)
        self._error: dict[str, str | None] = dict.fromkeys(reasons.SINKS)
        self._streaks = {sink: Streak(log, began="sink write failed; still serving, retrying "
                                      "every poll", ended="sink write recovered")
                         for sink in reasons.SINKS}

    def configure(self, sink: str, enabled: bool) -> None:
        """``disabled`` unless configured; a configured sink keeps a failing state it had."""
        self._enabled[sink] = enabled
        if not enabled:
            self._error[sink] = None
            self._streaks[sink].reset()

    def failed(self, sink: str, error: str, **context: object) -> None:
        """A write failed with ``error`` (one line): logged when a streak begins."""
        self._streaks[sink].failed(sink=sink, error=error, **context)
        self._error[sink] = error

    def ok(self, sink: str, **context: object) -> None:
        """A write succeeded: a streak's end is logged, with ``context``."""
        self._streaks[sink].recovered(sink=sink, **context)
        self._error[sink] = None

    def state(self, sink: str) -> SinkState:
        if not self._enabled[sink]:
            return "disabled"
        return "failing" if self._streaks[sink].ongoing else "ok"

    def error(self, sink: str) -> str | None:
        """The last write's error while the sink is failing (None otherwise)."""
        return self._error[sink]

    def report(self) -> SinksReport:
        return SinksReport(cache=self.state("cache"),
                           snapshot_file=self.state("snapshot_file"),
                           cache_error=self._error["cache"],
                           snapshot_file_error=self._error["snapshot_file"],
                           hook=None if self.hook is None else self.hook.report())


class SideSinks:
    """The snapshot file and the cache, each with what it is due to hold (the loop's task alone).

    A failed write leaves its sink *due*: retried at every attempt (every poll, and
    SIGHUP) until it succeeds. Each failed write counts in
    ``supervisor_sink_write_failures_total``. A sink file changed after a good write
    (removed, truncated, rewritten, replaced, chmod'ed, chown'ed) is written again.
    One ``stat`` per file per attempt compares it with what the write left, the
    cache's served mark included. A removed sink directory is made again by the next write
    (:mod:`supervisor.sinks.atomic`).
    """

    def __init__(self, metrics: Metrics, *, cache: LastKnownGood | None,
                 snapshot_file: SnapshotFile | None, status: SinkStatus | None = None,
                 forward_to: str | None = None) -> None:
        self.metrics = metrics
        self.forward_to = forward_to
        self.cache = cache
        self.snapshot_file = snapshot_file
        self.status = status if status is not None else SinkStatus()
        self.status.configure("cache", cache is not None)
        self.status.configure("snapshot_file", snapshot_file is not None)
        # What each sink is due to hold until a write succeeds.
        self._file_due: Snapshot | None = None
        self._cache_due: Serving | None = None
        # The last export that succeeded: re-written if the cache file vanishes or changes.
        self._last_export: Serving | None = None
        # What the last successful write of each left on disk (None: not written yet).
        self._file_print: Fingerprint | None = None
        self._cache_print: Fingerprint | None = None

    def resume(self, serving: Serving) -> None:
        """A restarted loop's sinks: a write the status says is failing is due again.

        The status outlives the loop, what was due does not: without this, a
        restart while the control plane is down left the failing sink behind
        what serves until a hydrate succeeded.
        """
        if self.snapshot_file is not None and self.status.state("snapshot_file") == "failing":
            self._file_due = serving.snapshot
        if (self.cache is not None and serving.source == "control_plane"
                and self.status.state("cache") == "failing"):
            self._cache_due = serving

    def _failed(self, sink: str, exc: BaseException, **context: object) -> None:
        self.metrics.sink_write_failures.labels(sink).inc()
        self.status.failed(sink, " ".join(str(exc).split()) or type(exc).__name__, **context)

    async def _changed(self, paths: tuple[str, ...], written: Fingerprint | None) -> bool:
        """True when the files differ from what the last write left (or, unwritten, are absent)."""
        try:
            now = await _files(lambda: _fingerprint(paths), "a sink file's status")
        except ThreadDeadline:
            return False  # a stuck disk: the write it would cause could not finish either
        if written is None:
            return now is None
        return now != written

    async def rewrite(self, serving: Serving) -> None:
        """Write both sinks for what serves (a restart or a new epoch may have missed one)."""
        self._file_due = serving.snapshot
        self._cache_due = serving
        await self.catch_up(serving)

    async def catch_up(self, serving: Serving | None) -> None:
        """Retry whatever write is still due, and re-write a sink file that vanished or changed."""
        if (serving is not None and self._file_due is None and self.snapshot_file is not None
                and await self._changed((self.snapshot_file.path,), self._file_print)):
            self._file_due = serving.snapshot
        if (self.cache is not None and self._cache_due is None and self._last_export is not None
                and await self._changed(self.cache.paths, self._cache_print)):
            # A removed or garbled mark must be written again, not assumed.
            self.cache.forget_files()
            self._cache_due = self._last_export
        if self._file_due is not None:
            await self._write_snapshot_file()
        if self._cache_due is not None:
            await self.export(self._cache_due)

    async def write_snapshot_file(self, serving: Serving) -> None:
        """The snapshot file now holds ``serving``, or is due to; then the hook is due."""
        self._file_due = serving.snapshot
        await self._write_snapshot_file()
        if self.status.hook is not None:
            self.status.hook.swapped()

    async def _write_snapshot_file(self) -> None:
        snapshot = self._file_due
        if self.snapshot_file is None or snapshot is None:
            self._file_due = None
            return
        snapshot_file = self.snapshot_file

        def write() -> Fingerprint:
            # The status of the file written, taken before its rename: a
            # consumer changing it the moment it appears is still noticed.
            return (_print_of(snapshot_file.write(snapshot)),)

        try:
            self._file_print = await _files(write, "the snapshot file write")
        except OSError as exc:
            self._failed("snapshot_file", exc, path=self.snapshot_file.path)
        else:
            self._file_due = None
            self.status.ok("snapshot_file", path=self.snapshot_file.path,
                           revision=snapshot.revision)

    @property
    def last_export(self) -> Serving | None:
        """What the cache holds or is due to hold (None: nothing exported yet)."""
        return self._cache_due or self._last_export

    async def _forward(self, statement: Statement | None) -> None:
        """Follower: the root's signed bytes of what is about to serve, for its followers.

        Written unchanged to ``<[cache].path>.upstream`` (what its ``GET /v1/revision``
        serves), before its own cache. Only for what is about to serve: a follower
        passes on its active revision's bytes, never those of one it refused.
        """
        if self.forward_to is None or statement is None or statement.signed is None:
            return
        path, data = self.forward_to, statement.signed
        try:
            await _files(lambda: write_atomic(path, data, mode=0o600),
                         "the root's statement write")
        except OSError as exc:
            # Only this replica's followers lose: they keep polling and retry.
            self.metrics.sink_write_failures.labels("cache").inc()
            log.warning("cannot keep the root's signed statement for this replica's "
                        "followers", path=path, error=str(exc))

    async def export(self, export: Serving) -> None:
        """The cache now holds ``export``, or is due to (and holds nothing newer).

        It carries the statement it serves under: a root's own, signed into the cache;
        a follower's, the root's (:meth:`_forward`). When the export fails, a newer cache,
        or one of the same id with another body, is removed (a rollback, or a restore then
        a publish; unlinking needs no disk space). So a boot cannot serve what the
        operator moved away from.
        """
        await self._forward(export.statement)
        if self.cache is None:
            return
        from supervisor.sinks.lkg import CacheError

        cache = self.cache
        paths = self.cache.paths

        def run() -> Fingerprint | None:
            candidate = export.candidate
            cache.export(revision=candidate.id, generation=export.generation,
                         schema_version=candidate.schema_version, body=candidate.body,
                         statement=export.statement, body_sha256=candidate.body_sha256)
            # Taken after both writes; nothing else writes these files (a
            # change in this instant is missed, unlike the snapshot file's).
            return _fingerprint(paths)

        def discard() -> bool:
            return cache.discard_if_newer(export.revision, export.candidate.body_sha256)

        self._cache_due = export
        try:
            written = await _files(run, "the cache write")
        except (CacheError, ThreadDeadline) as exc:
            self.metrics.last_known_good_events.labels("export_failed").inc()
            self._failed("cache", exc, revision=export.revision)
            try:
                removed = await _files(discard, "the cache removal")
            except (CacheError, ThreadDeadline) as discard_exc:
                log.error("the cache holds a newer revision than the one being served and "
                          "could not be removed", error=str(discard_exc))
            else:
                if removed:
                    log.warning("removed a cache newer than the revision being served (a "
                                "rollback whose export failed): a boot now uses the control "
                                "plane rather than the revision rolled back from",
                                path=cache.path, revision=export.revision)
        else:
            self._last_export = export
            self._cache_print = written
            self._cache_due = None
            self.metrics.last_known_good_events.labels("exported").inc()
            self.status.ok("cache", path=cache.path, revision=export.revision)


def _files(fn: Callable[[], T], what: str) -> Awaitable[T]:
    """``fn()`` in a worker thread of the files' own limit, within the file I/O deadline."""
    return in_thread(fn, dependency="files", deadline_s=FILE_IO_DEADLINE_S, what=what)
