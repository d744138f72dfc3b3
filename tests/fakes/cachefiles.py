"""The signed cache's file seam (:class:`~supervisor.sinks.lkg.files.CacheFiles`) for tests.

Real durable writes, each recorded; a stop (:class:`Stopped`, a SIGKILL) or an
OSError where a test says.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from supervisor.sinks.atomic import write_atomic
from supervisor.sinks.lkg.files import CacheFiles

__all__ = ["Recording", "Stopped"]


class Stopped(BaseException):
    """The process was stopped here (SIGKILL, power loss): nothing after it runs."""


class Recording:
    """The cache's file seam over the real durable writes, recording and optionally failing."""

    def __init__(self, stop_after: int | None = None, fail: OSError | None = None) -> None:
        self.written: list[str] = []
        self.removed: list[str] = []
        self.stop_after = stop_after
        self.fail = fail

    def write(self, path: str, data: bytes, *, mode: int) -> None:
        if self.stop_after is not None and len(self.written) >= self.stop_after:
            if self.fail is not None:
                raise self.fail
            raise Stopped
        write_atomic(path, data, mode=mode)
        self.written.append(path)

    def remove(self, path: str) -> None:
        if self.fail is not None and self.stop_after is None:
            raise self.fail
        os.unlink(path)
        self.removed.append(path)


if TYPE_CHECKING:
    # mypy holds the fake to the Protocol (tests/unit/test_fakes_conform.py runs it).
    _conforms: type[CacheFiles] = Recording
