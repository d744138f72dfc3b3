"""write_atomic: the target holds the new bytes with the mode, or its old content; no temp files."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from supervisor.sinks.atomic import write_atomic


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_writes_bytes_with_mode_0600_by_default(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(str(target), b'{"a": 1}')
    assert target.read_bytes() == b'{"a": 1}'
    assert _mode(target) == 0o600
    assert _entries(tmp_path) == ["state.json"]


def test_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_atomic(str(tmp_path / "wide"), b"x", mode=0o644)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "wide") == 0o644
    old = os.umask(0)
    try:
        write_atomic(str(tmp_path / "narrow"), b"x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "narrow") == 0o600


def test_replaces_existing_file_and_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old content that is longer")
    target.chmod(0o644)
    write_atomic(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert _mode(target) == 0o600
    assert _entries(tmp_path) == ["f"]


def test_empty_and_large_payloads(tmp_path: Path) -> None:
    write_atomic(str(tmp_path / "empty"), b"")
    assert (tmp_path / "empty").read_bytes() == b""
    big = os.urandom(3 * 1024 * 1024 + 17)
    write_atomic(str(tmp_path / "big"), big)
    assert (tmp_path / "big").read_bytes() == big


def test_relative_path_in_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_atomic("relative.bin", b"r")
    assert (tmp_path / "relative.bin").read_bytes() == b"r"
    assert _entries(tmp_path) == ["relative.bin"]


def test_missing_directory_raises_oserror_as_is(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(str(tmp_path / "absent" / "f"), b"x")


def test_directory_under_a_regular_file_fails_even_as_root(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        write_atomic(str(blocker / "f"), b"x")
    assert _entries(tmp_path) == ["file"]


def test_failed_rename_leaves_no_temp_file(tmp_path: Path) -> None:
    # A directory at the target: the temp file is written, then os.replace fails.
    (tmp_path / "target").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(str(tmp_path / "target"), b"x")
    assert _entries(tmp_path) == ["target"]


def _failing(monkeypatch: pytest.MonkeyPatch, name: str, exc: BaseException) -> None:
    def fail(*args: object) -> object:
        raise exc

    monkeypatch.setattr(os, name, fail)


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        ("write", OSError(errno.ENOSPC, "No space left on device")),
        ("fsync", OSError(errno.EIO, "Input/output error")),
        ("fchmod", OSError(errno.EPERM, "Operation not permitted")),
        ("replace", OSError(errno.EXDEV, "Invalid cross-device link")),
        ("write", KeyboardInterrupt()),
    ],
)
def test_failure_keeps_old_content_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, exc: BaseException
) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    _failing(monkeypatch, call, exc)
    with pytest.raises(type(exc)):
        write_atomic(str(target), b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert _entries(tmp_path) == ["f"]


def _fsync_failing_on_directories(monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    original = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(err, os.strerror(err))
        original(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_directory_fsync_unsupported_is_tolerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fsync_failing_on_directories(monkeypatch, errno.EINVAL)
    write_atomic(str(tmp_path / "f"), b"x")
    assert (tmp_path / "f").read_bytes() == b"x"


def test_directory_fsync_io_error_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fsync_failing_on_directories(monkeypatch, errno.EIO)
    with pytest.raises(OSError) as info:
        write_atomic(str(tmp_path / "f"), b"x")
    assert info.value.errno == errno.EIO
    # The rename happened; only its durability is unknown, which the caller hears about.
    assert _entries(tmp_path) == ["f"]


def test_directory_mode_is_the_mode_of_the_directory_the_path_is_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.sinks.atomic import directory_mode

    (tmp_path / "d").mkdir()
    os.chmod(tmp_path / "d", 0o750)
    assert directory_mode(str(tmp_path / "d" / "f")) == 0o750
    monkeypatch.chdir(tmp_path / "d")
    assert directory_mode("f") == 0o750  # a bare name is in the working directory
    (tmp_path / "file").write_bytes(b"")
    assert directory_mode(str(tmp_path / "file" / "f")) is None  # not a directory
    assert directory_mode(str(tmp_path / "absent" / "f")) is None


def test_a_missing_directory_is_made_again_with_the_exact_mode_and_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import supervisor.sinks.atomic as atomic

    synced: list[str] = []
    real_fsync_directory = atomic.fsync_directory

    def recording(directory: str) -> None:
        synced.append(directory)
        real_fsync_directory(directory)

    monkeypatch.setattr(atomic, "fsync_directory", recording)
    old_umask = os.umask(0o077)
    try:
        write_atomic(str(tmp_path / "sink" / "f"), b"x", directory_mode=0o755)
    finally:
        os.umask(old_umask)
    assert (tmp_path / "sink" / "f").read_bytes() == b"x"
    assert _mode(tmp_path / "sink") == 0o755
    assert str(tmp_path) in synced  # the new directory's entry made durable


def test_a_directory_that_cannot_be_made_again_raises_mkdirs_error(tmp_path: Path) -> None:
    missing_parent = tmp_path / "absent" / "sink"
    with pytest.raises(FileNotFoundError) as info:
        write_atomic(str(missing_parent / "f"), b"x", directory_mode=0o755)
    assert info.value.filename == str(missing_parent)
    assert isinstance(info.value.__cause__, FileNotFoundError)
