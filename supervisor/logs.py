"""Logging: structlog, one JSON object per line on stderr, or console lines.

Contract (docs/log-events.md): keys ``timestamp`` (ISO-8601 UTC),
``level``, ``event`` plus context; JSON when ``[log].format`` is ``json``, or
``auto`` and stderr is not a terminal. ``journal`` is the same JSON with a
syslog priority prefix per line (``<2>`` critical, ``<3>`` error, ``<4>``
warning, ``<6>`` info, ``<7>`` debug), which journald strips and stores as the
line's PRIORITY, so ``journalctl -p err`` finds errors; ``auto`` picks it when
``$JOURNAL_STREAM`` names stderr (its ``st_dev:st_ino`` are those of fd 2, as
systemd sets it for a service whose stderr is the journal). Lines of a
supervised child carry ``child=<name>`` (bound in the child's task through
:mod:`structlog.contextvars`, which trio tasks inherit at spawn).

The level is a module-level setting read by a filtering processor rather than
baked into a cached logger class, so SIGHUP can change it in place
(:func:`set_level`). The stdlib loggers of httpx, httpcore and psycopg
go through the same renderer at WARNING, so third-party lines never
break the one-object-per-line format.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["PRIORITIES", "configure", "get_logger", "resolve_format", "set_level"]

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
    """``journal``, ``json`` or ``console`` for the configured ``fmt`` on ``stream``."""
    if fmt != "auto":
        return fmt
    if _is_journal(stream, os.environ if environ is None else environ):
        return "journal"
    return "console" if stream.isatty() else "json"


def _journal_renderer(json_renderer: Processor) -> Processor:
    def render(logger: WrappedLogger, method: str, event_dict: EventDict) -> str:
        level = str(event_dict.get("level", method))
        priority = PRIORITIES.get(level, 3 if level == "exception" else 6)
        rendered = json_renderer(logger, method, event_dict)
        text = rendered.decode() if isinstance(rendered, bytes) else str(rendered)
        return f"<{priority}>{text}"

    return render


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog and the stdlib root logger; idempotent."""
    stream = stream if stream is not None else sys.stderr
    set_level(level)
    resolved = resolve_format(fmt, stream)
    as_json = resolved in ("json", "journal")
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    renderer: Processor
    if as_json:
        renderer = structlog.processors.JSONRenderer(default=str)
        if resolved == "journal":
            renderer = _journal_renderer(renderer)
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())
    structlog.configure(processors=[_filter_level, *shared, renderer],
                        logger_factory=structlog.PrintLoggerFactory(file=stream),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
                        cache_logger_on_first_use=True)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()])
    )
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
