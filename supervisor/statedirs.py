"""The state directories of relative paths: made at start, mode 0700."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from supervisor import logs
from supervisor.config import Config, sqlite_path
from supervisor.errors import ConfigError

__all__ = ["CONTROL_PLANE", "creation_problems", "make_state_directories", "state_directories"]

CONTROL_PLANE = "$.control_plane.url"
#: Narrowed by the umask, never widened: nobody else may list or replace what is inside.
MODE = 0o700

log = logs.get_logger("daemon")


def state_directories(config: Config) -> list[tuple[str, Path]]:
    """``(key, directory)`` of each relative state path the configuration names."""
    paths = [("$.snapshot.path", config.snapshot.path), ("$.cache.path", config.cache.path)]
    if config.control_plane.backend == "sqlite":
        paths.insert(0, (CONTROL_PLANE, sqlite_path(config.control_plane.url)))
    return [(key, Path(path).parent) for key, path in paths
            if path is not None and not Path(path).is_absolute()]


def _missing(directory: Path) -> tuple[list[Path], Path]:
    """The levels of ``directory`` that do not exist (outermost first), and the first that does."""
    missing: list[Path] = []
    at = Path(os.path.abspath(directory))
    while not os.path.lexists(at) and at.parent != at:
        missing.append(at)
        at = at.parent
    return missing[::-1], at


def _problem(directory: Path) -> str | None:
    """Why ``directory`` cannot be made (None: it exists or can be made)."""
    missing, existing = _missing(directory)
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if missing and not os.access(existing, os.W_OK | os.X_OK):
        return f"directory {existing} is not writable"
    return None


def _where(directory: Path) -> str:
    return f"directory {directory} (relative to {Path.cwd()})"


def creation_problems(config: Config) -> list[tuple[str, str]]:
    """``(key, problem)`` for each relative state directory that could not be made (``check``)."""
    problems = []
    for key, directory in state_directories(config):
        problem = _problem(directory)
        if problem is not None:
            problems.append((key, f"cannot create {_where(directory)}: {problem}"))
    return problems


def make_state_directories(config: Config, keys: Collection[str] | None = None) -> list[Path]:
    """Make the missing relative state directories (of ``keys``, default all); return them.

    A relative path (the default ``sqlite:///var/controlplane.db``, ``var/snapshot.json``)
    is under the working directory, which belongs to whoever runs the daemon there.
    ``run`` makes the directories of the SQLite file, snapshot and cache; ``publish``
    the SQLite file's. Each is mode 0700 (narrowed by the umask, never widened), logged
    as ``created state directory`` with its key. An existing directory is never changed.

    An absolute path's directory belongs to the deployment (``StateDirectory=``, a
    volume): a missing one is likelier an unmounted volume, so it is left alone. The
    cache makes its own directory, any path (LastKnownGood). A missing SQLite
    directory is refused with exit 2; ``check`` reports the rest.

    Only directories: ``publish`` alone makes the SQLite file. A missing file is an
    outage, not an empty control plane, so the daemon refuses to boot until a publish.

    Raises :class:`~supervisor.errors.ConfigError` at the key whose directory cannot be
    made (exit 2: no restart makes it).
    """
    made: list[Path] = []
    for key, directory in state_directories(config):
        if keys is not None and key not in keys:
            continue
        missing, _ = _missing(directory)
        for level in missing:
            try:
                os.mkdir(level, MODE)
            except FileExistsError:
                continue  # made meanwhile by someone else: used like any existing one
            except OSError as exc:
                raise ConfigError(key, f"cannot create {_where(directory)}: "
                                       f"{exc.strerror or exc} ({level})") from exc
            made.append(level)
            log.info("created state directory", key=key, path=str(level), mode=f"{MODE:04o}")
        problem = _problem(directory)
        if problem is not None:
            raise ConfigError(key, f"cannot create {_where(directory)}: {problem}")
    return made
