"""The cache's refusals and the key file's errors.

Bad keys and unsafe cache files are ConfigError instead (exit 2): see LastKnownGood.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, Literal

from supervisor import reasons
from supervisor.errors import LabelledError, SupervisorError

__all__ = [
    "UNWRITABLE",
    "CacheError",
    "CacheReason",
    "CacheSkew",
    "CacheUnwritable",
    "KeyFileError",
    "KeyFileExists",
    "unwritable",
]

# The label beyond the revision reasons of supervisor.reasons; spelled once here.
UNWRITABLE: Final = "unwritable"
CacheReason = Literal["corrupt", "denied", "incompatible", "rollback", "unwritable"]


class CacheError(LabelledError):
    """The cache was refused, or could not be written; the labels: LastKnownGood.load.

    ``reason`` is the label and ``path`` the file at fault (the cache or its ``.served``
    mark). ``detail`` explains, without the path. ``revision`` is the cached revision
    id once the refusal knows it authentically, else None.
    """

    reason: CacheReason

    def __init__(
        self, reason: CacheReason, path: str, detail: str, *, revision: int | None = None
    ) -> None:
        super().__init__(f"last-known-good cache {path}: {reason}: {detail}", reason=reason,
                         detail=detail, revision=revision)
        self.path = path


class CacheSkew(CacheError):
    """The cache's format is newer than this build reads: report it, treat it as no cache.

    The file is authentic (its signature verified) and probably intact: a
    newer build wrote it, and this one was rolled back onto the same volume.
    """

    def __init__(self, path: str, detail: str, *, format_version: int) -> None:
        self.format_version = format_version
        super().__init__(reasons.INCOMPATIBLE, path, detail)


class CacheUnwritable(CacheError):
    """The cache or its served-revision mark could not be written (``OSError`` chained)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(UNWRITABLE, path, detail)


@contextmanager
def unwritable(path: str, what: str) -> Iterator[None]:
    """An ``OSError`` inside becomes :class:`CacheUnwritable` at ``path``: ``what: strerror``."""
    try:
        yield
    except OSError as exc:
        raise CacheUnwritable(path, f"{what}: {exc.strerror or exc}") from exc


class KeyFileError(SupervisorError):
    """``keygen`` could not write the signing key file."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"signing key {path}: {detail}")


class KeyFileExists(KeyFileError):
    """The key file already exists; keygen never overwrites a key."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "already exists; refusing to overwrite a key")
