"""The snapshot file: the active snapshot as JSON, for local consumers.

Written by :func:`~.atomic.write_atomic`: a reader sees the previous snapshot or the new one.
Mode 0644: it holds digests, never secrets, and local consumers run as other users.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from supervisor.sinks.atomic import directory_mode, write_atomic

if TYPE_CHECKING:
    from supervisor.revision.snapshot import Snapshot

__all__ = ["SnapshotFile"]


class SnapshotFile:
    def __init__(self, path: str) -> None:
        self.path = path
        # None (no directory at start: a volume not mounted?): never made here.
        self.directory_mode = directory_mode(path)

    def write(self, snapshot: Snapshot) -> os.stat_result:
        """Write ``snapshot``; raises OSError on failure (the caller counts it).

        Returns the written file's status (see :func:`write_atomic`).
        """
        return write_atomic(self.path, snapshot.to_json(), mode=0o644,
                            directory_mode=self.directory_mode)
