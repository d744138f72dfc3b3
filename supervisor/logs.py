"""Logging: structlog, one JSON object per line on stderr, console lines, or journald.

The contract (keys, formats, journald fields): docs/log-events.md.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import socket
import struct
import sys
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["JOURNAL_SOCKET", "JOURNAL_SOCKET_ENV", "PRIORITIES", "JournalSocket", "configure",
           "get_logger", "journal_datagram", "resolve_format", "set_level"]

# syslog(3) priorities, as journald reads them from a "<N>" line prefix.
PRIORITIES = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
_LEVELS = {name: logging.getLevelNamesMapping()[name.upper()] for name in PRIORITIES}
_FOREIGN = ("httpx", "httpcore", "psycopg")
_threshold = logging.INFO


def _filter_level(_: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    level = _LEVELS.get(method, logging.INFO if method != "exception" else logging.ERROR)
    if level < _threshold:
        raise structlog.DropEvent
    return event_dict


def set_level(level: str) -> None:
    """Change the level in place (SIGHUP).

    The level is a module setting read by a filtering processor, not baked into a
    cached logger class, so it can change while running.
    """
    global _threshold
    _threshold = _LEVELS[level]


def _is_journal(stream: TextIO, environ: dict[str, str] | os._Environ[str]) -> bool:
    """True when ``$JOURNAL_STREAM`` ("DEV:INODE") names ``stream``'s file."""
    value = environ.get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):  # no file descriptor behind it (a StringIO), or closed
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def resolve_format(fmt: str, stream: TextIO,
                   environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """``journal``, ``json`` or ``console`` for the configured ``fmt`` on ``stream``.

    ``auto`` is ``journal`` when ``$JOURNAL_STREAM`` names ``stream`` (its
    ``st_dev:st_ino``, as systemd sets it), else ``json`` off a terminal, ``console`` on one.
    """
    if fmt != "auto":
        return fmt
    if _is_journal(stream, os.environ if environ is None else environ):
        return "journal"
    return "console" if stream.isatty() else "json"


#: What journald requires of a memfd it is passed: nothing may change it any more.
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
#: journald's native protocol socket.
JOURNAL_SOCKET = "/run/systemd/journal/socket"
#: Another path for it (a test's socket, a container's bind mount).
JOURNAL_SOCKET_ENV = "SUPERVISOR_JOURNAL_SOCKET"
IDENTIFIER = "trio-supervisor"
_NOT_FIELD = re.compile(r"[^A-Z0-9_]")


def _field_name(key: str) -> str:
    """A journal field name: upper case, ``[A-Z0-9_]``, not led by ``_`` or a digit."""
    name = _NOT_FIELD.sub("_", key.upper()).lstrip("_")[:64]
    return name if name and not name[0].isdigit() else f"F_{name}"[:64]


def journal_datagram(fields: dict[str, Any]) -> bytes:
    """``fields`` in the native protocol: ``KEY=value`` lines; a value with a newline as
    ``KEY\\n``, its length (64-bit little-endian), the value and ``\\n``."""
    out = bytearray()
    for key, value in fields.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        data = text.encode("utf-8", "replace")
        name = _field_name(key).encode()
        if b"\n" in data:
            out += name + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name + b"=" + data + b"\n"
    return bytes(out)


class JournalSocket:
    """Datagrams to journald; :meth:`send` never blocks and says whether one was taken."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)

    @classmethod
    def found(cls, path: str | None = None) -> JournalSocket | None:
        """The journal at ``path`` (default: ``$SUPERVISOR_JOURNAL_SOCKET`` or
        :data:`JOURNAL_SOCKET`), or None where no socket exists there."""
        path = path or os.environ.get(JOURNAL_SOCKET_ENV) or JOURNAL_SOCKET
        try:
            return cls(path) if os.path.exists(path) else None
        except OSError:
            return None

    def send(self, payload: bytes) -> bool:
        """Send one entry. One too large for a datagram goes as journald's own client
        sends it: in a sealed memfd, passed over the socket."""
        try:
            try:
                self._sock.sendto(payload, self.path)
            except OSError as exc:
                if exc.errno != errno.EMSGSIZE:
                    raise
                self._send_memfd(payload)
        except OSError:  # full (EAGAIN), gone, no memfd: the caller falls back
            return False
        return True

    def _send_memfd(self, payload: bytes) -> None:
        fd = os.memfd_create("journal-entry", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            with os.fdopen(fd, "wb", closefd=False) as memfd:
                memfd.write(payload)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            # socket.send_fds would drop the address (it sends to a connected peer only).
            rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))
            self._sock.sendmsg([], [rights], 0, self.path)
        finally:
            os.close(fd)


def _journal_renderer(json_renderer: Processor, journal: JournalSocket | None) -> Processor:
    def render(logger: WrappedLogger, method: str, event_dict: EventDict) -> str:
        level = str(event_dict.get("level", method))
        priority = PRIORITIES.get(level, 3 if level == "exception" else 6)
        rendered = json_renderer(logger, method, dict(event_dict))
        text = rendered.decode() if isinstance(rendered, bytes) else str(rendered)
        if journal is not None and journal.send(journal_datagram(
                {"MESSAGE": text, "PRIORITY": str(priority), "SYSLOG_IDENTIFIER": IDENTIFIER,
                 **event_dict})):
            raise structlog.DropEvent  # taken by the journal: nothing on stderr
        return f"<{priority}>{text}"

    return render


class _LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stdlib's lines, the same way: one the journal took (dropped) is not written."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            super().emit(record)
        except structlog.DropEvent:
            pass


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None, *,
              journal_socket: str | None = None) -> None:
    """Configure structlog and the stdlib root logger; idempotent.

    ``journal`` sends one datagram per event (:func:`journal_datagram`): each key a field
    in upper case (``journalctl REASON=secret``), ``MESSAGE`` the JSON line, ``PRIORITY``
    its syslog priority, ``SYSLOG_IDENTIFIER=trio-supervisor``. With no journal socket,
    or a refused datagram, the line goes to stderr as JSON behind a ``<N>`` priority prefix.
    ``journal_socket``: the journal's path (default as :meth:`JournalSocket.found`).

    httpx, httpcore and psycopg log through the same renderer at WARNING, so third-party
    lines keep the one-object-per-line format. A supervised child's lines carry
    ``child=<name>``, bound through :mod:`structlog.contextvars` (trio tasks inherit it).
    """
    stream = stream if stream is not None else sys.stderr
    set_level(level)
    resolved = resolve_format(fmt, stream)
    as_json = resolved in ("json", "journal")
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp")]
    renderer: Processor
    if as_json:
        renderer = structlog.processors.JSONRenderer(default=str)
        if resolved == "journal":
            renderer = _journal_renderer(renderer, JournalSocket.found(journal_socket))
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())
    structlog.configure(processors=[_filter_level, *shared, renderer],
                        logger_factory=structlog.PrintLoggerFactory(stream),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
                        cache_logger_on_first_use=True)
    handler = _LineHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in _FOREIGN:
        logging.getLogger(name).setLevel(logging.WARNING)


def get_logger(name: str | None = None, **context: Any) -> Any:
    """A structlog logger; ``name`` becomes the ``component`` key."""
    if name is not None:
        context = {"component": name, **context}
    return structlog.get_logger(**context)
