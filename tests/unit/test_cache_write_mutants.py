"""The cache's write paths under failures the mutation run found unasserted.

A signing key that cannot be written whole (the file size limit: a real
``EFBIG`` from the kernel, not a fake) leaves no file; a cache removed by
someone else while ``discard_if_newer`` removes it is no error; the mark
across a restart: a fresh instance (the next boot) never lowers what an
earlier one served, nor loads an older cache. Real files on a temporary
directory throughout.
"""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from supervisor.sinks.atomic import write_atomic
from supervisor.sinks.lkg import CacheError, KeyFileError, generate_signing_key
from tests.unit.test_lkg_safety import export, make, mark_of


@pytest.fixture
def signer(tmp_path: Path) -> tuple[str, str]:
    key = str(tmp_path / "signing.key")
    return key, generate_signing_key(key)


@pytest.fixture
def cache_path(tmp_path: Path) -> str:
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    return str(directory / "lkg.bin")


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes fail with EFBIG (SIGXFSZ ignored, as a daemon would)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_key_that_cannot_be_written_whole_is_refused_and_leaves_no_file(
    tmp_path: Path,
) -> None:
    out = tmp_path / "signing.key"
    with file_size_limit(0), pytest.raises(KeyFileError) as info:
        generate_signing_key(str(out))
    assert info.value.path == str(out)
    assert info.value.detail == "cannot write: File too large"
    assert not out.exists()  # a half-written key must never be trusted later


class RemovedMeanwhile:
    """The cache's file seam when another process removes the file first (real unlinks)."""

    def write(self, path: str, data: bytes, *, mode: int) -> None:
        write_atomic(path, data, mode=mode)

    def remove(self, path: str) -> None:
        os.unlink(path)  # the other process
        os.unlink(path)  # ours, which finds nothing there any more


def test_a_cache_removed_meanwhile_by_someone_else_is_not_reported_removed(
    cache_path: str, signer: tuple[str, str],
) -> None:
    cache = make(cache_path, signer, files=RemovedMeanwhile())
    export(cache, 9)
    assert cache.discard_if_newer(5) is False
    assert not Path(cache_path).exists()


def test_a_restarted_replica_keeps_the_mark_and_refuses_the_older_cache(
    cache_path: str, signer: tuple[str, str],
) -> None:
    # Served 9, then a stop between the mark write and the cache write of a
    # later move left the cache of 5 under the mark of 9 (written directly here).
    first = make(cache_path, signer)
    export(first, 5)
    first.note_served(9)
    assert mark_of(cache_path) == "9\n"
    restarted = make(cache_path, signer)
    # A note of a lower revision by the fresh instance never lowers the mark.
    restarted.note_served(5)
    assert mark_of(cache_path) == "9\n"
    with pytest.raises(CacheError) as info:
        restarted.load()
    assert info.value.reason == "rollback" and info.value.revision == 5
    assert "older than revision 9" in info.value.detail


def test_a_refused_cache_says_which_file_and_why_in_its_text(
    cache_path: str, signer: tuple[str, str],
) -> None:
    # The text is what a refused boot prints after "the last-known-good cache was refused".
    Path(cache_path).write_bytes(b"not a cache")
    Path(cache_path + ".served").write_text("1\n")
    with pytest.raises(CacheError) as info:
        make(cache_path, signer).load()
    assert str(info.value) == (
        f"last-known-good cache {cache_path}: {info.value.reason}: {info.value.detail}")
    assert info.value.reason == "corrupt"


def test_what_stands_at_a_cache_path_is_named_by_the_refusal_itself(tmp_path: Path) -> None:
    from supervisor.sinks.lkg.files import NotRegularFile, read_regular

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile) as info:
        read_regular(str(fifo))
    assert str(info.value) == info.value.kind == "a FIFO (named pipe)"


def test_an_atomic_write_leaks_no_descriptor(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for n in range(3):
        write_atomic(str(tmp_path / "f"), b"x" * n, mode=0o600)
    assert len(os.listdir("/proc/self/fd")) == before
    assert (tmp_path / "f").read_bytes() == b"xx"
