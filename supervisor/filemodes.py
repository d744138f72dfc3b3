"""Secret files that others may read: the admin token and the cache signing key.

``check`` prints a warning for each (and exits 2 under ``--strict``); the daemon
logs one at boot. A file is too open when others may read or write it, or when
its group may read it and that group is not the daemon's own (a Kubernetes
Secret volume is group-readable by design, through ``fsGroup`` = the pod's own
group, and that is fine).
"""

from __future__ import annotations

import os
import stat

from supervisor.config import Config

__all__ = ["loose_secret_files"]


def loose_secret_files(config: Config) -> list[tuple[str, str, str]]:
    """``(key, path, why)`` for each secret file readable beyond the daemon's user."""
    found: list[tuple[str, str, str]] = []
    for key, path in (
        ("$.admin.token_file", config.admin.token_file),
        ("$.cache.signing_key", config.cache.signing_key),
        ("$.admin.read_token_file", config.admin.read_token_file),
        ("$.admin.tls_key_file", config.admin.tls_key_file),
        ("$.control_plane.client_key_file", config.control_plane.client_key_file),
    ):
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
