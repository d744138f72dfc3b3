"""Files others may read, and places others may write."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from functools import partial

from supervisor.config import Config, sqlite_path
from supervisor.configchecks import note_problem, value_at
from supervisor.errors import ConfigError

__all__ = ["describe_mode", "loose_secret_files", "refuse_unsafe_place", "unsafe_state_places"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symbolic link"),
)


def describe_mode(mode: int) -> str:
    """``"a FIFO (named pipe)"``, ``"a directory"`` ...; ``"a regular file"`` for one."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _unsafe(path: str, st: os.stat_result, what: str, *, owner_only: bool = False) -> str | None:
    """Why another local user could replace ``path`` (``st``: its status); None: nobody can."""
    euid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != euid:
        return (f"{what} {path} (mode {mode:04o}) is owned by uid {st.st_uid}, not by this "
                f"process's user (uid {euid}); another user could replace what the daemon "
                "keeps there: chown it to the daemon's user (and run `check` as that user)")
    if not owner_only and mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{what} {path} has mode {mode:04o}: group- or world-writable, so another "
                "user could replace or delete what the daemon keeps there (or create it "
                "first); chmod go-w it (0700 or 0755 for the directory, 0600 or 0644 for "
                "the files)")
    return None


def refuse_unsafe_place(key: str, directory: str, what: str, files: Sequence[str]) -> None:
    """ConfigError at ``key`` when another user could replace ``directory`` or its ``files``.

    Each must belong to the effective uid and not be group- or world-writable. A sticky
    world-writable directory is refused too: another user may create the file first,
    and the daemon could then never replace it. Only the directory itself is checked,
    not its ancestors. A directory's symlinks are followed (a state directory may be a
    link). A file's are not: a symlink is checked for its owner only, and the reader
    refuses it as not a regular file. Used for the cache, the snapshot file and an
    SQLite control plane, each with its directory.

    A missing directory, or a non-directory where it should be, is not checked:
    the writes then fail (``unwritable``) and ``check`` reports it.
    """
    def inspect(path: str, *, follow: bool) -> os.stat_result | None:
        try:
            return os.stat(path, follow_symlinks=follow)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(key, f"cannot inspect {path}: {exc.strerror or exc}") from exc

    place = directory or "."
    st = inspect(place, follow=True)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return
    problem = _unsafe(place, st, what)
    for path in files:
        if problem is not None:
            break
        if (st := inspect(path, follow=False)) is not None:
            problem = _unsafe(path, st, describe_mode(st.st_mode),
                              owner_only=stat.S_ISLNK(st.st_mode))
    if problem is not None:
        raise ConfigError(key, problem)


def unsafe_state_places(config: Config) -> list[tuple[str, str]]:
    """``(key, problem)`` for the snapshot file's place and an SQLite control plane's
    (their directory, or a file in it, that another user could write)."""
    places: list[tuple[str, str, str, list[str]]] = []
    if config.snapshot.path is not None:
        path = config.snapshot.path
        places.append(("$.snapshot.path", os.path.dirname(path), "the snapshot directory",
                       [path]))
    if config.control_plane.backend == "sqlite":
        path = sqlite_path(config.control_plane.url)
        places.append(("$.control_plane.url", os.path.dirname(path),
                       "the control plane's directory",
                       [path + suffix for suffix in ("", "-wal", "-shm", "-journal")]))
    problems: list[tuple[str, str]] = []
    for place in places:
        note_problem(problems, partial(refuse_unsafe_place, *place))
    return problems


def loose_secret_files(config: Config) -> list[tuple[str, str, str]]:
    """``(key, path, why)`` for each secret file readable beyond the daemon's user.

    The secret files: the admin token and the cache signing key. Too open: others may
    read or write it, or its group may read it and is not the daemon's own. A Kubernetes
    Secret volume is group-readable by design (``fsGroup``, the pod's group): fine.
    ``check`` warns for each (exit 2 under ``--strict``); the daemon logs one at boot.
    """
    found: list[tuple[str, str, str]] = []
    for key in ("$.admin.token_file", "$.cache.signing_key", "$.admin.read_token_file",
                "$.admin.tls_key_file", "$.control_plane.client_key_file"):
        path = value_at(config, key)
        if path is None:
            continue
        try:
            info = os.stat(path)
        except OSError:
            continue  # unreadable or missing: check_files reports that
        mode = stat.S_IMODE(info.st_mode)
        if mode & (stat.S_IROTH | stat.S_IWOTH):
            found.append((key, path, f"readable by others (mode {mode:04o}); chmod 0600"))
        elif mode & (stat.S_IRGRP | stat.S_IWGRP) and info.st_gid != os.getegid():
            found.append((key, path, f"readable by group {info.st_gid} (mode {mode:04o}); "
                                     "chmod 0600"))
    return found
