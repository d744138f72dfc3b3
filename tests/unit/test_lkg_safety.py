"""The cache's defences: non-regular files, the served mark across stops and restarts,
discarding a newer cache, ownership and permissions, key text, negative revisions, and
the write paths under failure (a key the file size limit cuts short leaves no file, a
cache removed by someone else meanwhile is no error, a refusal names its file)."""

from __future__ import annotations

import base64
import os
import resource
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from supervisor.errors import ConfigError
from supervisor.sinks.atomic import write_atomic
from supervisor.sinks.lkg import (
    CacheError,
    CacheUnwritable,
    KeyFileError,
    generate_signing_key,
    parse_verify_key,
)
from tests.fakes.cachefiles import Recording, Stopped
from tests.lkgcache import BODY, export, make, mark_of

T = TypeVar("T")


@pytest.fixture
def signer(tmp_path: Path) -> tuple[str, str]:
    keys = tmp_path / "keys"
    keys.mkdir()
    path = str(keys / "signing.key")
    return path, generate_signing_key(path)


@pytest.fixture
def cache_path(tmp_path: Path) -> str:
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    return str(directory / "lkg.bin")


E = TypeVar("E", bound=BaseException)


def raised(kind: type[E], fn: Callable[..., object], *args: Any) -> E:
    """The ``kind`` exception ``fn(*args)`` raises (the test fails when it raises none)."""
    with pytest.raises(kind) as info:
        fn(*args)
    return info.value


def within(seconds: float, fn: Callable[[], T], unblock: Callable[[], None]) -> T:
    """Run ``fn`` in a thread; fail (after ``unblock`` frees it) when it takes longer."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            result.append(("err", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        unblock()
        thread.join(5)
        raise AssertionError(f"blocked for more than {seconds} s")
    kind, value = result[0]
    if kind == "err":
        raise value
    return value  # type: ignore[no-any-return]


def open_fifo_writer(path: str) -> Callable[[], None]:
    def unblock() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    return unblock


# --------------------------------------------------------------------------- not a regular file


def test_fifo_at_cache_path_is_refused_without_hanging(
    cache_path: str, signer: tuple[str, str]
) -> None:
    cache = make(cache_path, signer)
    os.mkfifo(cache_path, 0o600)
    with pytest.raises(CacheError) as info:
        within(5, cache.load, open_fifo_writer(cache_path))
    assert info.value.reason == "corrupt"
    assert info.value.path == cache_path
    assert "FIFO" in info.value.detail and cache_path in str(info.value)
    assert within(5, cache.cached_revision, open_fifo_writer(cache_path)) is None


@pytest.mark.parametrize("kind", ["directory", "socket", "symbolic link", "character device"])
def test_other_non_regular_files_at_cache_path_are_refused(
    cache_path: str, signer: tuple[str, str], tmp_path: Path, kind: str
) -> None:
    cache = make(cache_path, signer)
    export(cache, 3)
    target = tmp_path / "elsewhere.bin"
    os.replace(cache_path, target)
    if kind == "directory":
        os.mkdir(cache_path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(cache_path)
        sock.close()
    elif kind == "symbolic link":
        os.symlink(target, cache_path)  # a valid cache, but not the file the replica wrote
    else:
        try:
            os.mknod(cache_path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    err = raised(CacheError, cache.load)
    assert err.reason == "corrupt"
    assert kind in err.detail and "not a regular file" in err.detail


def test_fifo_at_mark_path_is_refused_by_load_and_replaced_by_export(
    cache_path: str, signer: tuple[str, str]
) -> None:
    cache = make(cache_path, signer)
    export(cache, 4)
    os.unlink(cache_path + ".served")
    os.mkfifo(cache_path + ".served", 0o600)
    fresh = make(cache_path, signer)
    err = raised(CacheError, within, 5, fresh.load,
                        open_fifo_writer(cache_path + ".served"))
    assert err.reason == "corrupt" and err.path == cache_path + ".served"
    assert "FIFO" in err.detail
    within(5, lambda: export(fresh, 5), open_fifo_writer(cache_path + ".served"))
    assert mark_of(cache_path) == "5\n"
    loaded = make(cache_path, signer).load()
    assert loaded is not None and loaded.revision == 5


# --------------------------------------------------------------------------- the served mark


@pytest.mark.parametrize("mark", [None, "0\n"])
def test_missing_or_zero_mark_next_to_a_cache_is_rollback(
    cache_path: str, signer: tuple[str, str], mark: str | None
) -> None:
    export(make(cache_path, signer), 9)
    served = cache_path + ".served"
    if mark is None:
        os.unlink(served)
    else:
        Path(served).write_text(mark)
    err = raised(CacheError, make(cache_path, signer).load)
    assert err.reason == "rollback"
    assert err.path == served and served in str(err)
    assert err.revision == 9
    assert "write" in err.detail and "9" in err.detail  # how to reset deliberately
    # The deliberate reset it describes works.
    Path(served).write_text("9\n")
    loaded = make(cache_path, signer).load()
    assert loaded is not None and loaded.revision == 9


def test_first_export_writes_the_mark_first(cache_path: str, signer: tuple[str, str]) -> None:
    files = Recording()
    export(make(cache_path, signer, files), 3)
    assert files.written == [cache_path + ".served", cache_path]


def _states() -> Iterator[tuple[str, int | None, int]]:
    # (name, revision already exported or None, revision exported next)
    yield "first export", None, 5
    yield "raising", 5, 9
    yield "lowering", 9, 5
    yield "same", 5, 5


@pytest.mark.parametrize(("name", "before", "after"), list(_states()))
@pytest.mark.parametrize("stop_after", [0, 1, 2])
def test_every_stop_point_of_an_export_leaves_a_loadable_state(
    cache_path: str, signer: tuple[str, str], name: str, before: int | None, after: int,
    stop_after: int,
) -> None:
    if before is not None:
        export(make(cache_path, signer), before)
    try:
        export(make(cache_path, signer, Recording(stop_after=stop_after)), after)
    except Stopped:
        pass
    # The invariant, on the files: a cache never exists without a mark, and the
    # mark is never above the cached revision.
    exists = os.path.exists(cache_path)
    mark = mark_of(cache_path)
    if exists:
        assert mark is not None, name
        assert int(mark) <= (make(cache_path, signer).cached_revision() or 0), name
    # What the next boot sees: the old or the new revision, or no cache; never a refusal.
    loaded = make(cache_path, signer).load()
    assert (loaded.revision if loaded else None) in {before, after}, name
    if stop_after >= 2:
        assert loaded is not None and loaded.revision == after


# --------------------------------------------------------------------------- discard_if_newer


def test_discard_if_newer_removes_only_a_newer_cache(
    cache_path: str, signer: tuple[str, str]
) -> None:
    cache = make(cache_path, signer)
    assert cache.discard_if_newer(1) is False  # no file: never raises
    export(cache, 9)
    assert cache.cached_revision() == 9
    assert cache.discard_if_newer(9) is False
    assert cache.discard_if_newer(12) is False
    assert os.path.exists(cache_path)
    assert cache.discard_if_newer(5) is True
    assert not os.path.exists(cache_path)
    assert cache.cached_revision() is None
    assert mark_of(cache_path) == "9\n"  # left as it is
    assert make(cache_path, signer).load() is None
    assert cache.discard_if_newer(5) is False


@pytest.mark.parametrize("stop_after", [0, 1])
def test_failed_rollback_export_then_discard_never_serves_the_newer_revision(
    cache_path: str, signer: tuple[str, str], stop_after: int
) -> None:
    # Serving 9; desired moved back to 5; the disk is full.
    export(make(cache_path, signer), 9)
    cache = make(cache_path, signer, Recording(stop_after=stop_after,
                                              fail=OSError(28, "No space left on device")))
    with pytest.raises(CacheUnwritable):
        export(cache, 5)
    assert cache.discard_if_newer(5) is True
    assert make(cache_path, signer).load() is None


def test_discard_failure_is_unwritable(cache_path: str, signer: tuple[str, str]) -> None:
    export(make(cache_path, signer), 9)
    cache = make(cache_path, signer, Recording(fail=OSError(30, "Read-only file system")))
    err = raised(CacheUnwritable, cache.discard_if_newer, 5)
    assert err.reason == "unwritable" and err.path == cache_path
    assert isinstance(err.__cause__, OSError)
    assert os.path.exists(cache_path)


def test_cached_revision_does_not_trust_or_need_the_signature(
    cache_path: str, signer: tuple[str, str]
) -> None:
    cache = make(cache_path, signer)
    export(cache, 7)
    data = Path(cache_path).read_bytes()
    Path(cache_path).write_bytes(data.replace(b'"revision":7', b'"revision":8', 1))
    assert cache.cached_revision() == 8  # for decisions and logs only
    assert raised(CacheError, cache.load).reason == "denied"
    Path(cache_path).write_bytes(b"garbage")
    assert cache.cached_revision() is None


# --------------------------------------------------------------------------- restarts


def test_a_restarted_replica_never_lowers_the_mark_by_note_served(
    cache_path: str, signer: tuple[str, str]
) -> None:
    first = make(cache_path, signer)
    export(first, 5)
    first.note_served(9)
    restarted = make(cache_path, signer)
    restarted.note_served(5)  # it served 5 (say, from the cache) before learning anything
    assert mark_of(cache_path) == "9\n"
    err = raised(CacheError, restarted.load)
    assert err.reason == "rollback" and err.revision == 5
    assert raised(CacheError, make(cache_path, signer).load).reason == "rollback"


def test_a_restarted_replica_knows_the_mark_before_its_first_load(
    cache_path: str, signer: tuple[str, str]
) -> None:
    first = make(cache_path, signer)
    export(first, 5)
    first.note_served(9)
    restarted = make(cache_path, signer)
    assert raised(CacheError, restarted.load).reason == "rollback"
    restarted.note_served(7)
    assert mark_of(cache_path) == "9\n"


# --------------------------------------------------------------------------- permissions


@pytest.mark.parametrize("mode", [0o770, 0o720, 0o707, 0o1777, 0o2770])
def test_unsafe_directory_mode_is_a_config_error(
    cache_path: str, signer: tuple[str, str], mode: int
) -> None:
    directory = os.path.dirname(cache_path)
    os.chmod(directory, mode)
    err = raised(ConfigError, make, cache_path, signer)
    assert err.path == "$.cache.path"
    assert directory in err.reason and f"{mode:04o}" in err.reason


@pytest.mark.parametrize("which", ["", ".served"])
def test_unsafe_file_mode_or_owner_is_a_config_error(
    cache_path: str, signer: tuple[str, str], which: str
) -> None:
    export(make(cache_path, signer), 3)
    target = cache_path + which
    os.chmod(target, 0o620)
    err = raised(ConfigError, make, cache_path, signer)
    assert err.path == "$.cache.path" and target in err.reason and "0620" in err.reason
    os.chmod(target, 0o600)
    make(cache_path, signer)
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(target, 65534, -1)
    err = raised(ConfigError, make, cache_path, signer)
    assert target in err.reason and "65534" in err.reason


def test_directory_of_another_user_is_a_config_error(
    cache_path: str, signer: tuple[str, str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    os.chown(os.path.dirname(cache_path), 65534, -1)
    err = raised(ConfigError, make, cache_path, signer)
    assert os.path.dirname(cache_path) in err.reason and "65534" in err.reason


def test_missing_directories_are_created_private(tmp_path: Path, signer: tuple[str, str]) -> None:
    path = tmp_path / "state" / "deeper" / "lkg.bin"
    old = os.umask(0o002)  # a permissive umask must not make them group-writable
    try:
        cache = make(str(path), signer)
    finally:
        os.umask(old)
    for directory in (tmp_path / "state", tmp_path / "state" / "deeper"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    export(cache, 1)
    assert make(str(path), signer).load() is not None


def test_uncreatable_directory_is_a_config_error(tmp_path: Path, signer: tuple[str, str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError) as info:
        make(str(blocker / "sub" / "lkg.bin"), signer)
    assert info.value.path == "$.cache.path" and str(blocker / "sub") in info.value.reason


# --------------------------------------------------------------------------- key text


_KEY = base64.b64encode(bytes(range(32))).decode()


@pytest.mark.parametrize(
    "text",
    [
        _KEY,  # no prefix
        "ED25519:" + _KEY,  # the prefix is case-sensitive
        "ed25519:" + _KEY.rstrip("="),  # unpadded
        "ed25519:" + _KEY[:20] + " " + _KEY[20:],  # inner whitespace
        "ed25519:" + _KEY[:20] + "\n" + _KEY[20:],
        "ed25519:" + base64.urlsafe_b64encode(b"\xfb" * 32).decode(),  # URL-safe alphabet
        "ed25519:" + _KEY[:-2] + "9=",  # same bytes, non-zero unused bits
        "ed25519:" + _KEY + "=",  # extra padding
        "ed25519:" + "é" * 44,  # not ASCII
        "ed25519:" + base64.b64encode(bytes(64)).decode(),  # a 64-byte (secret) key
    ],
)
def test_loose_key_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_verify_key(text)


def test_canonical_key_text_round_trips() -> None:
    key_id, key = parse_verify_key("  ed25519:" + _KEY + "\n")
    assert bytes(key) == bytes(range(32)) and len(key_id) == 16


# --------------------------------------------------------------------------- negative revisions


@pytest.mark.parametrize("name", ["revision", "generation", "schema_version"])
def test_export_refuses_negative_numbers_and_writes_nothing(
    cache_path: str, signer: tuple[str, str], name: str
) -> None:
    args = {"revision": 3, "generation": 1, "schema_version": 1, "body": BODY, name: -1}
    with pytest.raises(ValueError, match=name):
        make(cache_path, signer).export(**args)
    assert not os.path.exists(cache_path) and mark_of(cache_path) is None


def test_revision_zero_is_not_a_revision(cache_path: str, signer: tuple[str, str]) -> None:
    cache = make(cache_path, signer)
    with pytest.raises(ValueError, match="revision"):
        export(cache, 0)
    with pytest.raises(ValueError, match="revision"):
        cache.note_served(0)
    with pytest.raises(ValueError, match="revision"):
        cache.discard_if_newer(-1)
    assert mark_of(cache_path) is None


@pytest.mark.parametrize("damage", ["deleted", "zero"])
def test_forget_files_makes_the_next_export_rewrite_a_damaged_mark(
    cache_path: str, signer: tuple[str, str], damage: str
) -> None:
    """The running daemon's cache, its mark damaged under it, heals at the next export.

    The mark is rewritten only when its value changes; the sinks' catch-up calls
    ``forget_files`` when it sees the files changed, so the same revision's
    export writes the mark again and the next boot loads the cache.
    """
    cache = make(cache_path, signer)
    export(cache, 9)
    served = cache_path + ".served"
    if damage == "deleted":
        os.unlink(served)
    else:
        Path(served).write_text("0\n")
    export(cache, 9)  # not told: the mark is believed intact
    assert mark_of(cache_path) != "9\n"
    cache.forget_files()
    export(cache, 9)
    assert mark_of(cache_path) == "9\n"
    loaded = make(cache_path, signer).load()
    assert loaded is not None and loaded.revision == 9


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
