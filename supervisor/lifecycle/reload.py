"""SIGHUP's re-read of the configuration file: off the event loop, with a deadline."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec
import trio

from supervisor.config import Config
from supervisor.configfile import load
from supervisor.errors import ConfigError
from supervisor.logs import get_logger

__all__ = ["RELOADABLE", "RELOAD_TIMEOUT_S", "ConfigReload", "changed_keys", "read_regular_config"]

log = get_logger("daemon")

#: How long one re-read may take before it is given up.
RELOAD_TIMEOUT_S = 5.0

#: Keys SIGHUP applies to the running process; any other change needs a restart.
RELOADABLE = frozenset({"log.level"})


def read_regular_config(path: str) -> Config:
    """:func:`~supervisor.configfile.load`, refusing anything but a regular file (blocking).

    ``stat`` (symlinks followed: a Kubernetes ConfigMap is a link) does not
    block on a FIFO the way ``open`` does.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError("$", f"cannot read: {exc}", source=path) from exc
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "not a regular file"
        raise ConfigError("$", f"{kind}: only a regular file is re-read", source=path)
    return load(path)


def _flatten(value: Any, prefix: str, into: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), into)
    else:
        into[prefix] = value
    return into


def changed_keys(running: Config, fresh: Config) -> list[str]:
    """Dotted keys (``control_plane.url``) whose value differs, sorted."""
    old = _flatten(msgspec.to_builtins(running), "", {})
    new = _flatten(msgspec.to_builtins(fresh), "", {})
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))


class ConfigReload:
    """Re-reads ``path`` for SIGHUP; compares with ``running`` (the configuration in force).

    Only ``[log].level`` applies without a restart (:data:`RELOADABLE`); see :meth:`restart_needed`.
    """

    def __init__(self, path: str, running: Config, *, timeout_s: float = RELOAD_TIMEOUT_S,
                 read: Callable[[str], Config] = read_regular_config) -> None:
        self.path = path
        self.running = running
        self.timeout_s = timeout_s
        self._read = read
        self._limiter = trio.CapacityLimiter(1)
        #: Why the last :meth:`read` gave None (None: it succeeded), for STATUS=.
        self.last_error: str | None = None

    async def read(self) -> Config | None:
        """The file's configuration, or None (the reason logged) when it cannot be had in time.

        The read runs in a worker thread under ``RELOAD_TIMEOUT_S``. So nothing at the path
        can stop the event loop, nor with it ``/healthz`` and the watchdog. A FIFO or device
        is refused before it is opened. A read that hangs (a hard NFS mount whose server is
        gone) is abandoned at the deadline; its thread finishes by itself. These reads have
        a limiter of their own, one thread. A hung read never takes a thread the stores
        need; later SIGHUPs report it instead of piling up threads.
        """
        fresh: Config | None = None
        # This read's own error: two quick SIGHUPs read concurrently (one
        # waiting for the other's thread), and neither may report the other's.
        error: str | None = None
        with trio.move_on_after(self.timeout_s) as scope:
            try:
                # The scope's deadline bounds it; one read at a time (its own limiter).
                fresh = await trio.to_thread.run_sync(partial(self._read, self.path),
                                                      abandon_on_cancel=True, limiter=self._limiter)
            except ConfigError as exc:
                error = str(exc)
        if scope.cancelled_caught:
            error = (f"{self.path}: reading it did not finish within "
                     f"{self.timeout_s:g} s (a hung mount?); the running "
                     "configuration stays in force")
        self.last_error = error
        if error is not None:
            log.error("SIGHUP: configuration not reloaded", error=error)
            return None
        return fresh

    def restart_needed(self, fresh: Config) -> list[str]:
        """The changed keys SIGHUP cannot apply; logged as one warning line when any.

        The line is ``SIGHUP: restart needed for``, the keys in ``keys``. So an operator who
        edited ``[control_plane].url`` and sent SIGHUP learns the edit is not in force.
        """
        keys = [key for key in changed_keys(self.running, fresh) if key not in RELOADABLE]
        if keys:
            log.warning("SIGHUP: restart needed for", keys=keys)
        return keys
