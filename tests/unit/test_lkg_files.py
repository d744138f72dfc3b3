"""The signed cache's files: the served mark, keys and keygen, framing, modes and descriptors.

The served mark's text and its bounds, a mark that is only rewritten when it
changes, the age, discarding, the key texts, framing refusals and descriptor
use. Against real files in a
temporary directory and the cache's own file seam.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from supervisor.sinks.lkg import (
    CacheError,
    CacheUnwritable,
    LastKnownGood,
    Statement,
    generate_signing_key,
)
from supervisor.sinks.lkg.fileformat import Header
from tests.fakes.cachefiles import Recording, Stopped
from tests.lkgcache import export, make, mark_of

BODY = b'{"schema_version": 1, "aliases": {}}'


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


# -- the mark's text -------------------------------------------------------------------


@pytest.mark.parametrize("text", ["7", "7\n", "  7 \n", "00000000000000000007"])
def test_a_mark_equal_to_the_cache_in_any_spelling_loads(
    cache_path: str, signer: tuple[str, str], text: str,
) -> None:
    export(make(cache_path, signer), 7)
    Path(cache_path + ".served").write_text(text)
    loaded = make(cache_path, signer).load()
    assert loaded is not None and loaded.revision == 7


@pytest.mark.parametrize("text", ["000000000000000000007", "7x", "-7", "", "\n"])
def test_a_mark_that_is_not_a_revision_id_refuses_the_cache(
    cache_path: str, signer: tuple[str, str], text: str,
) -> None:
    export(make(cache_path, signer), 7)
    Path(cache_path + ".served").write_text(text)
    with pytest.raises(CacheError) as info:
        make(cache_path, signer).load()
    if text.strip():
        assert info.value.reason == "corrupt"
        assert info.value.path == cache_path + ".served"
    else:  # empty: as good as no mark, which is never trusted
        assert info.value.reason in ("corrupt", "rollback")


def test_a_mark_above_the_cache_refuses_it_naming_the_cache(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 7)
    Path(cache_path + ".served").write_text("8\n")
    with pytest.raises(CacheError) as info:
        make(cache_path, signer).load()
    assert info.value.reason == "rollback"
    assert info.value.path == cache_path
    assert info.value.revision == 7
    assert "older than revision 8" in info.value.detail


def test_a_mark_of_zero_next_to_a_cache_is_refused_naming_the_mark(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 7)
    Path(cache_path + ".served").write_text("0\n")
    with pytest.raises(CacheError) as info:
        make(cache_path, signer).load()
    assert info.value.reason == "rollback"
    assert info.value.path == cache_path + ".served"
    assert "mark is 0 next to a cache of revision 7" in info.value.detail
    Path(cache_path + ".served").unlink()
    with pytest.raises(CacheError) as info:
        make(cache_path, signer).load()
    assert "mark is missing next to a cache of revision 7" in info.value.detail


# -- the mark is written only when it changes, and only upwards by note_served ------------


def test_the_mark_is_rewritten_only_when_it_changes(
    cache_path: str, signer: tuple[str, str],
) -> None:
    files = Recording()
    cache = make(cache_path, signer, files)
    export(cache, 5)
    export(cache, 5)
    cache.note_served(5)
    cache.note_served(3)
    served = cache_path + ".served"
    assert files.written.count(served) == 1
    assert files.written.count(cache_path) == 2
    cache.note_served(6)
    assert files.written.count(served) == 2
    assert mark_of(cache_path) == "6\n"


def test_a_restarted_replica_rewrites_an_equal_mark_not_at_all(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 5)
    files = Recording()
    restarted = make(cache_path, signer, files)
    restarted.note_served(5)
    assert files.written == []
    restarted.note_served(4)  # never lowers what the earlier run served
    assert files.written == []
    assert mark_of(cache_path) == "5\n"


def test_a_failed_mark_write_is_retried_by_the_next_note(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 5)
    files = Recording(stop_after=0, fail=OSError(28, "No space left on device"))
    cache = make(cache_path, signer, files)
    with pytest.raises(CacheUnwritable) as info:
        cache.note_served(8)
    assert info.value.path == cache_path + ".served"
    assert mark_of(cache_path) == "5\n"
    files.stop_after = None  # the disk has room again
    cache.note_served(6)  # below what is noted in memory: the mark goes to 8
    assert mark_of(cache_path) == "8\n"


def test_a_garbled_mark_is_rewritten_by_the_next_export(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 5)
    Path(cache_path + ".served").write_text("garbage")
    cache = make(cache_path, signer)
    export(cache, 5)
    assert mark_of(cache_path) == "5\n"
    loaded = make(cache_path, signer).load()
    assert loaded is not None and loaded.revision == 5


@pytest.mark.parametrize("revision", [0, -1])
def test_note_served_refuses_what_is_not_a_revision(
    cache_path: str, signer: tuple[str, str], revision: int,
) -> None:
    cache = make(cache_path, signer)
    with pytest.raises(ValueError, match="revision must be >= 1"):
        cache.note_served(revision)
    assert mark_of(cache_path) is None


# -- discard ----------------------------------------------------------------------------------


def test_discard_if_newer_at_the_boundaries(cache_path: str, signer: tuple[str, str]) -> None:
    cache = make(cache_path, signer)
    assert cache.discard_if_newer(0) is False  # nothing there
    export(cache, 5)
    assert cache.discard_if_newer(5) is False
    assert os.path.exists(cache_path)
    assert cache.discard_if_newer(4) is True
    assert not os.path.exists(cache_path)
    with pytest.raises(ValueError, match="revision must be >= 0"):
        cache.discard_if_newer(-1)


# -- age ---------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_age_counts_from_the_export_and_is_never_negative(
    cache_path: str, signer: tuple[str, str],
) -> None:
    clock = Clock()
    cache = LastKnownGood(cache_path, signing_key_path=signer[0], trusted_keys=[signer[1]],
                          max_schema_version=1, clock=clock)
    export(cache, 3)
    loaded = cache.load()
    assert loaded is not None and loaded.age_s == 0.0
    clock.now += timedelta(seconds=90)
    assert loaded.age_s == 90.0
    clock.now -= timedelta(hours=1)  # the clock was set back
    assert loaded.age_s == 0.0
    assert loaded.created_at == datetime(2026, 1, 1, tzinfo=UTC)


# -- what the cache shows of itself ------------------------------------------------------------


def test_a_loaded_revision_never_shows_its_body_or_clock_and_compares_by_content(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 3)
    first = make(cache_path, signer).load()
    second = LastKnownGood(cache_path, signing_key_path=signer[0], trusted_keys=[signer[1]],
                           max_schema_version=1, clock=Clock()).load()
    assert first is not None and second is not None
    assert "aliases" not in repr(first) and "_clock" not in repr(first)
    assert first == second  # the clock each was read with is not part of the revision


def test_a_cache_without_a_signing_key_is_not_trusted_for_signing(
    cache_path: str, signer: tuple[str, str],
) -> None:
    cache = LastKnownGood(cache_path, signing_key_path=None, trusted_keys=[signer[1]],
                          max_schema_version=1)
    assert cache.signing_key_trusted is False and cache.signing_key_id is None


def test_generation_and_schema_version_zero_are_exported(
    cache_path: str, signer: tuple[str, str],
) -> None:
    cache = make(cache_path, signer)
    cache.export(revision=2, generation=0, schema_version=0, body=BODY)
    loaded = make(cache_path, signer).load()
    assert loaded is not None and (loaded.generation, loaded.schema_version) == (0, 0)


def test_a_stop_while_raising_from_revision_one_leaves_a_loadable_cache(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 1)
    with pytest.raises(Stopped):
        export(make(cache_path, signer, Recording(stop_after=1)), 5)
    loaded = make(cache_path, signer).load()
    assert loaded is not None and loaded.revision == 5
    assert mark_of(cache_path) == "1\n"


def test_a_raising_export_raises_the_mark_for_later_notes(
    cache_path: str, signer: tuple[str, str],
) -> None:
    cache = make(cache_path, signer)
    export(cache, 5)
    export(cache, 9)
    assert mark_of(cache_path) == "9\n"
    cache.note_served(7)
    assert mark_of(cache_path) == "9\n"


# -- failure texts name the OS error, not its repr ------------------------------------------


NO_SPACE = OSError(28, "No space left on device")


def test_write_failures_name_the_os_error(cache_path: str, signer: tuple[str, str]) -> None:
    with pytest.raises(CacheUnwritable) as info:
        export(make(cache_path, signer, Recording(stop_after=0, fail=NO_SPACE)), 3)
    assert info.value.detail.endswith(": No space left on device")
    export(make(cache_path, signer), 3)  # mark and cache exist; now the cache write fails
    with pytest.raises(CacheUnwritable) as info:
        export(make(cache_path, signer, Recording(stop_after=0, fail=NO_SPACE)), 4)
    assert info.value.path == cache_path
    assert info.value.detail == "the cache could not be written: No space left on device"
    export(make(cache_path, signer), 8)
    with pytest.raises(CacheUnwritable) as info:
        make(cache_path, signer, Recording(fail=OSError(5, "Input/output error"))
             ).discard_if_newer(2)
    assert info.value.detail.endswith("could not be removed: Input/output error")


def test_an_uncreatable_cache_directory_names_the_os_error(
    tmp_path: Path, signer: tuple[str, str],
) -> None:
    from supervisor.errors import ConfigError

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError) as info:
        make(str(blocker / "sub" / "lkg.bin"), signer)
    assert info.value.reason == f"cannot create the cache directory {blocker / 'sub'}: Not a directory"


# -- file descriptors are not leaked --------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_reading_and_refusing_leak_no_descriptors(cache_path: str, signer: tuple[str, str]) -> None:
    export(make(cache_path, signer), 3)
    cache = make(cache_path, signer)
    before = _open_fds()
    for _ in range(20):
        assert cache.load() is not None
    os.unlink(cache_path)
    os.mkdir(cache_path)  # a directory where the cache should be
    for _ in range(20):
        with pytest.raises(CacheError):
            cache.load()
    assert _open_fds() == before


# -- keys -------------------------------------------------------------------------------------


def test_a_trusted_key_entry_that_is_not_text_is_named() -> None:
    from supervisor.errors import ConfigError
    from supervisor.sinks.lkg.keys import parse_trusted

    with pytest.raises(ConfigError) as info:
        parse_trusted([7])  # type: ignore[list-item]
    assert (info.value.path, info.value.reason) == ("$.cache.trusted_keys[0]", "expected a string")


def test_an_unreadable_signing_key_names_the_os_error(tmp_path: Path) -> None:
    from supervisor.errors import ConfigError
    from supervisor.sinks.lkg import load_signing_key

    missing = tmp_path / "absent.key"
    with pytest.raises(ConfigError) as info:
        load_signing_key(str(missing))
    assert info.value.reason == f"cannot read {missing}: No such file or directory"


def test_keygen_failures_name_the_os_error(tmp_path: Path) -> None:
    from supervisor.sinks.lkg import KeyFileError

    with pytest.raises(KeyFileError) as info:
        generate_signing_key(str(tmp_path / "no" / "such" / "dir" / "k"))
    assert str(info.value).endswith("cannot create: No such file or directory")


def test_keygen_writes_mode_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o277)
    try:
        generate_signing_key(str(tmp_path / "k"))
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "k").st_mode & 0o777 == 0o600


def test_keygen_to_a_bare_file_name_and_without_leaking_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from supervisor.sinks.lkg import load_signing_key

    monkeypatch.chdir(tmp_path)
    before = _open_fds()
    verify = generate_signing_key("signing.key")
    assert _open_fds() == before
    assert load_signing_key("signing.key") is not None
    assert verify.startswith("ed25519:")


# -- the file format ----------------------------------------------------------------------------


def _framed(header: bytes, rest: bytes = b"") -> bytes:
    import struct

    from supervisor.sinks.lkg import MAGIC

    return MAGIC + struct.pack(">I", len(header)) + header + rest


def _decode_detail(data: bytes) -> str:
    from supervisor.sinks.lkg.fileformat import decode_file

    with pytest.raises(CacheError) as info:
        decode_file(data, "/c", {})
    return info.value.detail


def test_framing_refusals_say_where_the_file_ends() -> None:
    import struct

    from supervisor.sinks.lkg import MAGIC, MAX_HEADER_BYTES

    assert MAX_HEADER_BYTES == 65536
    assert _decode_detail(MAGIC[:5]) == "truncated to 5 bytes, inside the magic"
    assert _decode_detail(b"not a cache") == "not a last-known-good cache file (bad magic)"
    assert _decode_detail(MAGIC + b"\x00") == "truncated inside the header length"
    too_long = MAGIC + struct.pack(">I", MAX_HEADER_BYTES + 1) + b"{}"
    assert _decode_detail(too_long) == "header length 65537 exceeds 65536"
    assert _decode_detail(MAGIC + struct.pack(">I", 100) + b"{}") == "truncated inside the header"
    assert _decode_detail(_framed(b"{}", b"\x00" * 10)) == "truncated inside the signature"


def test_an_unknown_key_id_is_shown_bounded() -> None:
    import json as jsonlib

    long_id = "x" * 60
    data = _framed(jsonlib.dumps({"format_version": 1, "key_id": long_id}).encode(),
                   b"\x00" * 64)
    assert _decode_detail(data) == (
        f"signed by key id {repr(long_id)[:37]}..., which is not in cache.trusted_keys")
    exact = "y" * 38  # its repr is exactly 40 characters: shown whole
    data = _framed(jsonlib.dumps({"format_version": 1, "key_id": exact}).encode(), b"\x00" * 64)
    assert _decode_detail(data) == f"signed by key id {exact!r}, which is not in cache.trusted_keys"


def test_an_oversized_header_is_never_written() -> None:
    import nacl.signing

    from supervisor.sinks.lkg import encode_file

    with pytest.raises(ValueError, match="exceeds 65536"):
        encode_file(b" " * 65537, b"", nacl.signing.SigningKey.generate())


@pytest.mark.parametrize(("prefix", "expected"), [
    (b"", None),
    (b"TRIO", None),
    (b"bad magic but long enough to hold a length and a header", None),
    ("MAGIC", None),  # the magic alone: no length yet
    ('{"revision": 4}', 4),
    ('{"revision": 0}', 0),
    ('{"revision": -1}', None),
    ('{"revision": true}', None),
    ('{"revision": "4"}', None),
    ("cut", None),  # shorter than its length says
    ("huge", None),  # a length over the limit
])
def test_peek_revision_reads_only_a_plain_revision(prefix: object, expected: int | None) -> None:
    import struct

    from supervisor.sinks.lkg import MAGIC
    from supervisor.sinks.lkg.fileformat import peek_revision

    if prefix == "MAGIC":
        data = MAGIC
    elif prefix == "cut":
        data = MAGIC + struct.pack(">I", 50) + b'{"revision": 4}'
    elif prefix == "huge":
        data = MAGIC + struct.pack(">I", 70000) + b'{"revision": 4}' + b" " * 70000
    elif isinstance(prefix, str):
        data = _framed(prefix.encode())
    else:
        assert isinstance(prefix, bytes)
        data = prefix
    assert peek_revision(data) == expected


def test_a_naive_clock_is_utc_whatever_the_local_zone(
    cache_path: str, signer: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        cache = LastKnownGood(cache_path, signing_key_path=signer[0], trusted_keys=[signer[1]],
                              max_schema_version=1, clock=lambda: datetime(2025, 1, 2, 3, 4, 5))
        export(cache, 1)
        loaded = cache.load()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert loaded is not None
    assert loaded.created_at == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_describe_mode_names_regular_files_too() -> None:
    import stat

    from supervisor.sinks.lkg.files import describe_mode

    assert describe_mode(stat.S_IFREG | 0o600) == "a regular file"
    assert describe_mode(stat.S_IFDIR | 0o700) == "a directory"
    assert describe_mode(0) == "not a regular file"


def test_a_directory_that_cannot_be_inspected_is_a_config_error(
    tmp_path: Path, signer: tuple[str, str],
) -> None:
    from supervisor.errors import ConfigError

    loop = tmp_path / "loop"
    os.symlink(loop, loop)  # stat: too many levels of symbolic links
    with pytest.raises(ConfigError) as info:
        make(str(loop / "lkg.bin"), signer)
    assert info.value.reason == f"cannot inspect {loop}: Too many levels of symbolic links"
    long_name = tmp_path / ("x" * 300)
    with pytest.raises(ConfigError) as info:
        make(str(long_name), signer)
    assert info.value.reason == f"cannot inspect {long_name}: File name too long"


def test_a_cache_at_a_relative_path_exports_and_discards(
    tmp_path: Path, signer: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = tmp_path / "rel"
    directory.mkdir(mode=0o700)
    monkeypatch.chdir(directory)
    cache = make("lkg.bin", signer)
    export(cache, 5)
    assert cache.discard_if_newer(3) is True
    assert not (directory / "lkg.bin").exists()


def test_a_cache_that_cannot_be_opened_for_want_of_descriptors_is_corrupt(
    cache_path: str, signer: tuple[str, str],
) -> None:
    import resource

    export(make(cache_path, signer), 5)
    cache = make(cache_path, signer)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    # A new descriptor takes the lowest free number, which the limit now forbids.
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        with pytest.raises(CacheError) as info:
            cache.load()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert info.value.reason == "corrupt" and info.value.path == cache_path
    assert info.value.detail == "cannot be read: Too many open files"


def test_a_key_id_repr_of_41_characters_is_cut() -> None:
    import json as jsonlib

    key_id = "z" * 39  # repr: 41 characters, one over the bound
    data = _framed(jsonlib.dumps({"format_version": 1, "key_id": key_id}).encode(), b"\x00" * 64)
    assert _decode_detail(data) == (
        f"signed by key id {repr(key_id)[:37]}..., which is not in cache.trusted_keys")


# -- the header's version 2 statement fields ---------------------------------------------------


_ISSUED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _statement(body: bytes = BODY, root: str = "ops") -> Statement:
    import hashlib

    return Statement(7, hashlib.sha256(body).hexdigest(), 3, root, _ISSUED,
                     _ISSUED + timedelta(hours=1))


def _header(key_id: str = "", **kwargs: object) -> bytes:
    from supervisor.sinks.lkg import encode_header

    fields: dict[str, object] = {"revision": 7, "generation": 1, "schema_version": 1,
                                 "created_at": _ISSUED, "body": BODY, "key_id": key_id}
    return encode_header(**{**fields, **kwargs})  # type: ignore[arg-type]


def _decode_with(mutate: Callable[[dict[str, Any]], None] | None = None,
                 **kwargs: Any) -> tuple[Header, bytes]:
    """Decode a file whose header is ``_header(**kwargs)``, signed by a fresh key,
    after ``mutate`` (a function of the header's JSON object) if given."""
    import json as jsonlib

    import nacl.signing

    from supervisor.sinks.lkg import encode_file
    from supervisor.sinks.lkg.fileformat import decode_file
    from supervisor.sinks.lkg.keys import key_id_of

    key = nacl.signing.SigningKey.generate()
    key_id = key_id_of(key.verify_key)
    header = _header(key_id, **kwargs)
    if mutate is not None:
        fields = jsonlib.loads(header)
        mutate(fields)
        header = jsonlib.dumps(fields).encode()
    return decode_file(encode_file(header, BODY, key), "/c", {key_id: key.verify_key})


def test_a_version_2_header_round_trips_its_statement() -> None:
    statement = _statement()
    header, body = _decode_with(statement=statement)
    assert header.format_version == 2 and body == BODY
    assert header.statement() == statement


def test_a_naive_statement_time_is_written_as_utc_whatever_the_local_zone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    aware = _statement()
    naive = Statement(aware.revision, aware.body_sha256, aware.sequence, aware.root,
                      aware.issued_at.replace(tzinfo=None), aware.expires_at)
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        header, _ = _decode_with(statement=naive)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert header.issued_at == _ISSUED and header.issued_at.utcoffset() == timedelta(0)


def test_a_header_missing_any_statement_field_has_no_statement() -> None:
    import msgspec.structs

    whole = Header(
        format_version=2, revision=7, generation=1, schema_version=1, created_at=_ISSUED,
        body_length=1, body_sha256="0" * 64, key_id="0" * 16, sequence=3, root="ops",
        issued_at=_ISSUED, expires_at=_ISSUED)
    assert whole.statement() is not None
    for name in ("sequence", "root", "issued_at", "expires_at"):
        assert msgspec.structs.replace(whole, **{name: None}).statement() is None


def test_a_version_2_header_without_statement_fields_is_corrupt() -> None:
    with pytest.raises(CacheError) as info:
        _decode_with(format_version=2)
    assert info.value.detail == "the version 2 header is authentic but lacks its statement fields"


def test_a_version_1_header_with_statement_fields_is_corrupt() -> None:
    with pytest.raises(CacheError) as info:
        _decode_with(format_version=1, statement=_statement())
    assert info.value.detail == "the version 1 header is authentic but carries statement fields"


def test_a_statement_time_without_a_zone_is_corrupt() -> None:
    def naive(fields: dict[str, str]) -> None:
        fields["expires_at"] = fields["expires_at"].removesuffix("Z")

    with pytest.raises(CacheError) as info:
        _decode_with(naive, statement=_statement())
    assert info.value.detail == "the header is authentic but its times have no time zone"


def test_a_version_3_header_is_skew_not_corruption() -> None:
    from supervisor.sinks.lkg import CacheSkew

    with pytest.raises(CacheSkew):
        _decode_with(format_version=3, statement=_statement())


@pytest.mark.parametrize(("length", "accepted"), [(0, False), (1, True), (512, True),
                                                  (513, False)])
def test_a_statement_root_is_one_to_512_characters(length: int, accepted: bool) -> None:
    def root(fields: dict[str, object]) -> None:
        fields["root"] = "r" * length

    if accepted:
        header, _ = _decode_with(root, statement=_statement())
        assert header.root == "r" * length
    else:
        with pytest.raises(CacheError, match="malformed"):
            _decode_with(root, statement=_statement())


def test_an_export_signs_only_a_statement_about_its_own_revision_and_body(
    cache_path: str, signer: tuple[str, str],
) -> None:
    cache = make(cache_path, signer)
    statement = _statement()
    for wrong in (Statement(8, statement.body_sha256, 3, "ops", _ISSUED, _ISSUED),
                  Statement(7, "0" * 64, 3, "ops", _ISSUED, _ISSUED)):
        with pytest.raises(ValueError, match="another revision or body"):
            cache.export(revision=7, generation=1, schema_version=1, body=BODY, statement=wrong)
    assert not os.path.exists(cache_path)
    cache.export(revision=7, generation=1, schema_version=1, body=BODY, statement=statement)
    loaded = make(cache_path, signer).load()
    assert loaded is not None and loaded.statement == statement


def test_a_cache_refuses_its_own_verify_key_among_upstream_keys(
    cache_path: str, signer: tuple[str, str], tmp_path: Path,
) -> None:
    from supervisor.errors import ConfigError

    other = generate_signing_key(str(tmp_path / "keys" / "other.key"))
    cache = make(cache_path, signer)
    cache.refuse_own_key_among([other], "$.follow.trusted_keys")  # the root's keys only
    with pytest.raises(ConfigError) as info:
        cache.refuse_own_key_among([other, signer[1]], "$.follow.trusted_keys")
    assert "own cache verify key" in str(info.value) and "$.follow.trusted_keys" in str(info.value)
    unsigned = LastKnownGood(cache_path, signing_key_path=None, trusted_keys=[signer[1]],
                             max_schema_version=1)
    unsigned.refuse_own_key_among([signer[1]], "$.follow.trusted_keys")  # no key of its own


# -- one daemon per cache ------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_cache_lock_refuses_a_second_holder_until_it_is_released(tmp_path: Path) -> None:
    from supervisor.errors import StartError
    from supervisor.sinks.lkg.files import hold_cache_lock

    cache = str(tmp_path / "state" / "cache.lkg")
    first = hold_cache_lock(cache)  # its missing directory is made
    assert first is not None and first.path == cache + ".lock"
    assert os.stat(first.path).st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "state").st_mode & 0o777 == 0o700
    fds = _open_fds()
    assert Path(first.path).read_text() == f"{os.getpid()}\n"  # the holder's pid
    with pytest.raises(StartError) as refused:
        hold_cache_lock(cache, wait_s=0)  # the process test waits the 10 s
    assert str(refused.value) == (f"{cache} is in use by another daemon (pid {os.getpid()} "
                                  f"holds the lock {first.path}, still after 0 s): one daemon "
                                  "per cache")
    assert _open_fds() == fds  # the refused attempt closed its descriptor
    first.release()
    first.release()  # a second release is harmless
    assert _open_fds() == fds - 1
    second = hold_cache_lock(cache)
    assert second is not None
    second.release()


def test_a_lock_that_fails_otherwise_is_a_config_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.errors import ConfigError
    from supervisor.sinks.lkg import files

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(37, "No locks available")

    monkeypatch.setattr(files.fcntl, "flock", no_locks)
    cache = str(tmp_path / "cache.lkg")
    fds = _open_fds()
    with pytest.raises(ConfigError) as refused:
        files.hold_cache_lock(cache)
    assert refused.value.path == "$.cache.path"
    assert refused.value.reason == f"cannot lock {cache}.lock: No locks available"
    assert _open_fds() == fds


def test_a_lock_file_that_cannot_be_made_leaves_the_cache_unlocked(tmp_path: Path) -> None:
    from supervisor.sinks.lkg.files import hold_cache_lock

    (tmp_path / "a-file").write_text("")
    assert hold_cache_lock(str(tmp_path / "a-file" / "cache.lkg")) is None
    # A symlink at the lock's path is not followed.
    os.symlink(tmp_path / "elsewhere", tmp_path / "cache.lkg.lock")
    assert hold_cache_lock(str(tmp_path / "cache.lkg")) is None
    assert not (tmp_path / "elsewhere").exists()
