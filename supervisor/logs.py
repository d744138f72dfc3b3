"""Logging: structlog, one JSON object per line on stderr, or console lines.

Contract (CONTRACT.md section 1): keys ``timestamp`` (ISO-8601 UTC), ``level``,
``event`` plus context; JSON when ``[log].format`` is ``json``, or ``auto`` and
stderr is not a terminal. Lines of a supervised child carry ``child=<name>``
(bound in the child's task through :mod:`structlog.contextvars`, which trio
tasks inherit at spawn).

The level is a module-level setting read by a filtering processor rather than
baked into a cached logger class, so SIGHUP can change it in place
(:func:`set_level`). The stdlib loggers of httpx, httpcore, psycopg and
hypercorn go through the same renderer at WARNING, so third-party lines never
break the one-object-per-line format.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["configure", "get_logger", "set_level"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_FOREIGN = ("httpx", "httpcore", "psycopg", "hypercorn", "hypercorn.error", "hypercorn.access")
_threshold = logging.INFO


def _filter_level(_: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    level = _LEVELS.get(method, logging.INFO if method != "exception" else logging.ERROR)
    if level < _threshold:
        raise structlog.DropEvent
    return event_dict


def set_level(level: str) -> None:
    global _threshold
    _threshold = _LEVELS[level]


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog and the stdlib root logger; idempotent."""
    stream = stream if stream is not None else sys.stderr
    set_level(level)
    as_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    renderer: Processor
    if as_json:
        renderer = structlog.processors.JSONRenderer(default=str)
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())
    structlog.configure(
        processors=[_filter_level, *shared, renderer],
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        )
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
