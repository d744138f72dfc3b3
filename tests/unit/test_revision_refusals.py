"""Revision documents and compilation: what is refused, with which label and place.

Bracketed hosts that are not IPv6, the TOML path's own checks, the version
checks' boundaries, and the compile stages' labels (a transient shortage while
reading a secret stays ``unavailable``), secret files' limits and confinement.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from supervisor import reasons
from supervisor.bounds import DETAIL_BYTES
from supervisor.revision.compile import compile_revision
from supervisor.revision.document import decode_body, document_from_object
from supervisor.revision.errors import RevisionError
from supervisor.revision.files import load_document_file
from supervisor.revision.secrets import EnvFileResolver


def body(**top: object) -> bytes:
    return json.dumps({"schema_version": 1, **top}).encode()


class Shortage:
    """A resolver meeting EMFILE, as EnvFileResolver reports it."""

    def resolve(self, reference: str) -> bytes:
        raise RevisionError(reasons.UNAVAILABLE, "secret file /s: Too many open files "
                                                 "(transient; retried)")


def test_a_transient_secret_shortage_stays_unavailable_through_compile() -> None:
    doc = body(aliases={"a": {"upstream": "https://a.internal"}},
               keys={"k": {"secret": "file:/s", "aliases": ["a"]}})
    with pytest.raises(RevisionError) as info:
        compile_revision(doc, revision=4, generation=1, resolver=Shortage())
    assert info.value.reason == reasons.UNAVAILABLE
    assert info.value.revision == 4
    assert info.value.detail.startswith("$.keys.k.secret: ")


def test_an_emfile_reading_a_secret_file_is_unavailable_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = tmp_path / "s"
    secret.write_text("v")
    real_open = __import__("os").open

    def exhausted(path: object, *args: object, **kwargs: object) -> int:
        if str(path) == str(secret):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr("supervisor.revision.secrets.os.open", exhausted)
    doc = body(aliases={"a": {"upstream": "https://a.internal"}},
               keys={"k": {"secret": f"file:{secret}", "aliases": ["a"]}})
    with pytest.raises(RevisionError) as info:
        compile_revision(doc, revision=1, generation=1, resolver=EnvFileResolver({}))
    assert info.value.reason == reasons.UNAVAILABLE
    assert info.value.detail == (
        f"$.keys.k.secret: secret file {secret}: Too many open files (transient; retried)")


# -- bracketed hosts ------------------------------------------------------------------------

@pytest.mark.parametrize("upstream", [
    "http://[1.2.3.4]/", "https://[::1:2:3:4:5:6:7:8:9]/", "http://[:::]/", "http://[1::2::3]:80/",
])
def test_a_bracketed_host_that_is_not_ipv6_is_refused(upstream: str) -> None:
    with pytest.raises(RevisionError) as info:
        decode_body(body(aliases={"a": {"upstream": upstream}}), revision=2)
    assert info.value.reason == reasons.VALIDATION
    assert info.value.detail == (
        "$.aliases.a.upstream: host must be a DNS name or an IP address (IPv6 in brackets)")


@pytest.mark.parametrize("upstream", [
    "http://[::1]/", "https://[2001:db8::7]:8443/v1", "http://[::ffff:1.2.3.4]",
])
def test_a_bracketed_ipv6_host_is_accepted(upstream: str) -> None:
    doc = decode_body(body(aliases={"a": {"upstream": upstream}}))
    assert doc.aliases["a"].upstream == upstream


def test_a_bad_bracketed_host_after_good_ones_is_named() -> None:
    aliases = {"a": {"upstream": "http://[::1]/"}, "b": {"upstream": "http://ok.internal"},
               "c": {"upstream": "http://[1.2.3.4]/"}}
    with pytest.raises(RevisionError) as info:
        decode_body(body(aliases=aliases))
    assert info.value.detail.startswith("$.aliases.c.upstream: ")


# -- the TOML path validates by the same rules ----------------------------------------------


def test_document_from_object_applies_the_document_rules() -> None:
    with pytest.raises(RevisionError) as info:
        document_from_object({"schema_version": 1,
                              "aliases": {"a": {"upstream": "http://[1.2.3.4]/"}}}, revision=3)
    assert info.value.reason == reasons.VALIDATION and info.value.revision == 3
    with pytest.raises(RevisionError) as info:
        document_from_object({"schema_version": 1, "aliases": {"a": {"upstream": "http://a"}},
                              "keys": {"k": {"secret": "env:K", "aliases": ["a", "a"]}}})
    assert info.value.detail == "$.keys.k.aliases[1]: alias 'a' is listed twice"


def test_a_toml_file_is_checked_before_encoding(tmp_path: Path) -> None:
    path = tmp_path / "rev.toml"
    path.write_text('schema_version = 1\n[aliases.a]\nupstream = "http://[1.2.3.4]/"\n')
    with pytest.raises(RevisionError) as info:
        load_document_file(path)
    assert info.value.reason == reasons.VALIDATION
    assert info.value.detail == (
        f"{path}: $.aliases.a.upstream: host must be a DNS name or an IP address "
        "(IPv6 in brackets)")


# -- failure texts of the document path ----------------------------------------------------


def test_an_unreadable_document_file_names_the_os_error(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    with pytest.raises(RevisionError) as info:
        load_document_file(missing)
    assert info.value.detail == f"{missing}: cannot read: No such file or directory"


@pytest.mark.parametrize(("obj", "detail"), [
    ([], "$: expected an object, got an array"),
    ({"schema_version": {}}, "$.schema_version: expected an integer, got an object"),
    ({"schema_version": [1]}, "$.schema_version: expected an integer, got an array"),
])
def test_kinds_are_named_in_refusals(obj: object, detail: str) -> None:
    with pytest.raises(RevisionError) as info:
        document_from_object(obj)
    assert info.value.detail == detail


def test_a_toml_integer_past_the_digit_limit_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "rev.toml"
    path.write_text("\nschema_version = 1\nx = " + "1" * 5000 + "\n")  # a blank first line
    with pytest.raises(RevisionError) as info:
        load_document_file(path)
    assert info.value.reason == reasons.VALIDATION
    assert info.value.detail == (
        f"{path}: $: not TOML here: an integer at line 3 has more than 4300 digits")


def test_toml_nested_too_deeply_is_a_validation_error_at_the_root(tmp_path: Path) -> None:
    path = tmp_path / "rev.toml"
    path.write_text("schema_version = 1\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(RevisionError) as info:
        load_document_file(path)
    assert info.value.reason == reasons.VALIDATION
    assert "$: not TOML here: arrays or inline tables nested too deeply" in info.value.detail


# -- compile ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("dangling", "tail"), [
    (1, ""),
    (2, " (1 more unknown alias reference)"),
    (3, " (2 more unknown alias references)"),
])
def test_projection_counts_the_other_dangling_references(dangling: int, tail: str) -> None:
    doc = body(aliases={"a": {"upstream": "https://a.internal"}},
               keys={"k": {"secret": "env:K", "aliases": [f"x{i}" for i in range(dangling)]}})
    with pytest.raises(RevisionError) as info:
        compile_revision(doc, revision=1, generation=1, resolver=EnvFileResolver({"K": "v"}))
    assert info.value.detail == f"$.keys.k.aliases[0]: key 'k' names unknown alias 'x0'{tail}"


def test_a_resolver_out_of_memory_is_not_a_refusal() -> None:
    class Exhausted:
        def resolve(self, reference: str) -> bytes:
            raise MemoryError

    doc = body(aliases={"a": {"upstream": "https://a.internal"}},
               keys={"k": {"secret": "env:K", "aliases": ["a"]}})
    with pytest.raises(MemoryError):
        compile_revision(doc, revision=1, generation=1, resolver=Exhausted())


# -- secret files -----------------------------------------------------------------------------


def test_secret_files_up_to_the_limit_are_read_and_larger_ones_refused(tmp_path: Path) -> None:
    from supervisor.revision.secrets import MAX_SECRET_BYTES

    assert MAX_SECRET_BYTES == 65536
    exact = tmp_path / "exact"
    exact.write_bytes(b"s" * 65536)
    assert EnvFileResolver({}).resolve(f"file:{exact}") == b"s" * 65536
    over = tmp_path / "over"
    over.write_bytes(b"s" * 65537)
    with pytest.raises(RevisionError) as info:
        EnvFileResolver({}).resolve(f"file:{over}")
    assert info.value.reason == reasons.SECRET
    assert "of at most 65536 bytes" in info.value.detail


def test_a_permanent_os_error_is_a_secret_refusal_not_a_shortage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = tmp_path / "s"
    secret.write_text("v")
    real_open = __import__("os").open

    def denied(path: object, *args: object, **kwargs: object) -> int:
        if str(path) == str(secret):
            raise OSError(errno.EIO, "Input/output error")
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr("supervisor.revision.secrets.os.open", denied)
    with pytest.raises(RevisionError) as info:
        EnvFileResolver({}).resolve(f"file:{secret}")
    assert info.value.reason == reasons.SECRET


def test_reading_secret_files_leaks_no_descriptors(tmp_path: Path) -> None:
    import os

    secret = tmp_path / "s"
    secret.write_text("v\n")
    (tmp_path / "dir").mkdir()
    resolver = EnvFileResolver({})
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert resolver.resolve(f"file:{secret}") == b"v"
        with pytest.raises(RevisionError):
            resolver.resolve(f"file:{tmp_path / 'dir'}")
    assert len(os.listdir("/proc/self/fd")) == before


def test_an_unencodable_environment_value_is_refused() -> None:
    with pytest.raises(RevisionError) as info:
        EnvFileResolver({"K": "\ud800x"}).resolve("env:K")
    # A lone surrogate that surrogateescape cannot map back to a byte.
    assert info.value.reason == reasons.SECRET
    assert info.value.detail == "environment variable K cannot be encoded as bytes"


@pytest.mark.parametrize("reference", ["file:/run/secrets/a\x00b", "env:TEAM\x00X"])
@pytest.mark.parametrize("dirs", [(), ("/run/secrets",)])
def test_a_reference_with_a_nul_byte_is_a_secret_refusal(
        reference: str, dirs: tuple[str, ...]) -> None:
    # No path or variable name holds a NUL: os.open would raise ValueError.
    resolver = EnvFileResolver({"TEAM": "x"}, dirs=dirs)
    for attempt in (resolver.resolve, resolver.check_place):
        with pytest.raises(RevisionError) as info:
            attempt(reference)
        assert info.value.reason == reasons.SECRET
        assert "\x00" not in info.value.detail


def test_a_refusal_names_its_revision() -> None:
    refusal = RevisionError(reasons.CORRUPT, "not JSON", revision=5)
    assert (refusal.reason, refusal.detail, refusal.revision) == (reasons.CORRUPT, "not JSON", 5)
    assert str(refusal) == "revision 5 refused (corrupt): not JSON"
    assert str(RevisionError(reasons.CORRUPT, "not JSON")) == "revision refused (corrupt): not JSON"


def test_a_secret_file_that_fails_while_being_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A regular file whose read fails (EIO) after it was opened and checked: the
    # read error, not only the open error, is a refusal naming nothing but the path.
    import errno
    import io
    import os

    path = tmp_path / "key"
    path.write_bytes(b"s3cret")

    class FailingReader(io.RawIOBase):
        def read(self, size: int = -1) -> bytes:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdopen", lambda *_a, **_k: FailingReader())
    with pytest.raises(RevisionError) as info:
        EnvFileResolver({}).resolve(f"file:{path}")
    assert info.value.reason == reasons.SECRET
    assert info.value.detail.startswith(f"secret file {path} cannot be resolved")


@pytest.mark.parametrize("nested", [
    b"[" * 5000 + b"]" * 5000,
    b'{"schema_version": 1, "aliases": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001,
])
def test_json_nested_too_deeply_is_corrupt_not_a_crash(nested: bytes) -> None:
    with pytest.raises(RevisionError) as info:
        decode_body(nested, revision=4)
    assert (info.value.reason, info.value.detail, info.value.revision) == (
        reasons.CORRUPT, "JSON nested too deeply", 4)


@pytest.mark.parametrize(("reference", "refused"), [
    ("env:TEAM_A", None), ("env:HOME", "outside [revision].secret_env_prefixes"),
    ("file:/run/keys/a", None), ("file:/run/keys/x/../b", None),
    ("file:/run/keys/../x", "outside [revision].secret_dirs"),
    ("file:/run/keysx/a", "outside [revision].secret_dirs"),
    # Malformed or empty: nothing to say about a place (resolve refuses them itself).
    ("env:", None), ("file:", None), ("HOME", None), ("envHOME", None), ("vault:x", None),
])
def test_check_place_refuses_by_place_alone(reference: str, refused: str | None) -> None:
    resolver = EnvFileResolver(environ={}, env_prefixes=("TEAM_",), dirs=("/run/keys",))
    if refused is None:
        resolver.check_place(reference)  # nothing here exists: nothing was looked up
        return
    with pytest.raises(RevisionError) as info:
        resolver.check_place(reference)
    assert info.value.reason == "secret" and refused in info.value.detail
    with pytest.raises(RevisionError) as resolved:
        resolver.resolve(reference)
    assert resolved.value.detail == info.value.detail  # the same words as resolve's


def test_check_place_without_confinement_refuses_nothing() -> None:
    for reference in ("env:HOME", "file:/etc/shadow"):
        EnvFileResolver(environ={}).check_place(reference)


@pytest.mark.parametrize("reference", ["file://proc/version", "file:///sys/power/state",
                                       "file://dev/stdin"])
def test_a_system_directory_spelled_with_leading_slashes_is_refused_by_place(
        reference: str) -> None:
    # POSIX keeps a leading "//" through abspath; Linux reads it as "/".
    with pytest.raises(RevisionError) as info:
        EnvFileResolver(environ={}).check_place(reference)
    assert info.value.reason == "secret" and "under /proc, /sys or /dev" in info.value.detail


def test_a_file_opened_through_a_link_leading_outside_is_refused(tmp_path: Path) -> None:
    """The check on the opened file itself (what a swapped symlink meets)."""
    from supervisor.revision.secrets import _read_file

    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("s3cret")
    (inside / "ok").write_text("fine")
    (inside / "link").symlink_to(outside / "secret")
    assert _read_file(str(inside / "ok"), confined_to=(str(inside),)) == b"fine"
    assert _read_file(str(inside / "link")) == b"s3cret"  # unconfined: links are followed
    with pytest.raises(RevisionError) as info:
        _read_file(str(inside / "link"), confined_to=(str(inside),))
    assert info.value.reason == "secret" and "cannot be resolved" in info.value.detail


def test_the_portable_opened_file_check(tmp_path: Path) -> None:
    """Without /proc (an fd it cannot name), the real path must be inside and be the
    very file opened (device and inode)."""
    import os

    from supervisor.revision.secrets import _opened_inside

    inside = tmp_path / "in"
    inside.mkdir()
    (inside / "a").write_text("a")
    (inside / "b").write_text("b")
    (tmp_path / "outside").write_text("o")
    (inside / "out").symlink_to(tmp_path / "outside")
    no_fd = 1 << 20  # /proc/self/fd has no such entry
    dirs = (str(inside),)
    st_a = os.stat(inside / "a")
    assert _opened_inside(no_fd, str(inside / "a"), st_a, dirs) is True
    assert _opened_inside(no_fd, str(inside / "b"), st_a, dirs) is False  # another file
    assert _opened_inside(no_fd, str(inside / "out"), os.stat(tmp_path / "outside"),
                          dirs) is False  # its real path is outside
    assert _opened_inside(no_fd, str(inside / "gone"), st_a, dirs) is False  # vanished


def test_a_variable_the_daemon_reads_is_refused_even_when_set() -> None:
    with pytest.raises(RevisionError) as info:
        EnvFileResolver({"PGPASSWORD": "hunter2"}).resolve("env:PGPASSWORD")
    assert info.value.reason == "secret" and "the daemon itself reads" in info.value.detail


def test_a_symlink_leading_outside_the_dirs_is_refused_before_anything_is_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inside = tmp_path / "in"
    inside.mkdir()
    (tmp_path / "outside").write_text("o")
    (inside / "out").symlink_to(tmp_path / "outside")

    def no_open(path: str, *_: object) -> int:
        raise AssertionError(f"{path} opened")

    monkeypatch.setattr("supervisor.revision.secrets._read_file", no_open)
    with pytest.raises(RevisionError) as info:
        EnvFileResolver({}, dirs=(str(inside),)).resolve(f"file:{inside / 'out'}")
    assert "cannot be resolved" in info.value.detail


def test_a_credential_file_is_refused_under_another_name_and_others_are_read(
        tmp_path: Path) -> None:
    (tmp_path / "token").write_text("daemon-credential")
    (tmp_path / "other").write_text("team-secret")
    (tmp_path / "alias").symlink_to(tmp_path / "token")
    resolver = EnvFileResolver({}, credentials=(str(tmp_path / "gone"), str(tmp_path / "token")))
    assert resolver.resolve(f"file:{tmp_path / 'other'}") == b"team-secret"
    with pytest.raises(RevisionError) as info:
        resolver.resolve(f"file:{tmp_path / 'alias'}")
    assert "cannot be resolved" in info.value.detail


def test_a_file_the_kernel_names_under_dev_is_refused(tmp_path: Path) -> None:
    """/dev/shm is a tmpfs: only the opened file's name tells it is under /dev."""
    import os

    from supervisor.revision.secrets import _read_file

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    secret = shm / f"revision-secret-{os.getpid()}"
    secret.write_text("s")
    (tmp_path / "link").symlink_to(secret)
    try:
        with pytest.raises(RevisionError) as info:
            _read_file(str(tmp_path / "link"))
    finally:
        secret.unlink()
    assert "cannot be resolved" in info.value.detail


def test_a_file_on_a_kernel_filesystem_is_refused_by_its_filesystem_type(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Wherever proc is mounted: the kernel's name of the file is not consulted here."""
    from supervisor.revision.secrets import _libc_fstatfs, _read_file

    _libc_fstatfs.cache_clear()  # libc asked afresh, by this test
    monkeypatch.setattr("supervisor.revision.secrets._opened_at", lambda fd: None)
    with pytest.raises(RevisionError) as info:
        _read_file("/proc/self/status")
    assert "cannot be resolved" in info.value.detail


def test_the_filesystem_type_of_a_proc_file_is_procs_magic_number() -> None:
    import os

    from supervisor.revision.secrets import _filesystem_type, _libc_fstatfs

    _libc_fstatfs.cache_clear()  # libc asked afresh, by this test
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        assert _filesystem_type(fd) == 0x9FA0
    finally:
        os.close(fd)
    assert _filesystem_type(1 << 20) is None  # fstatfs fails on a closed descriptor


def test_the_kernel_filesystems_are_linux_magic_numbers() -> None:
    """The numbers of include/uapi/linux/magic.h, transcribed independently."""
    from supervisor.revision.secrets import _KERNEL_FILESYSTEMS

    magic = {
        "PROC_SUPER_MAGIC": 0x9fa0, "SYSFS_MAGIC": 0x62656572,
        "CGROUP_SUPER_MAGIC": 0x27e0eb, "CGROUP2_SUPER_MAGIC": 0x63677270,
        "SECURITYFS_MAGIC": 0x73636673, "DEBUGFS_MAGIC": 0x64626720,
        "TRACEFS_MAGIC": 0x74726163, "BPF_FS_MAGIC": 0xcafe4a11,
        "CONFIGFS_MAGIC": 0x62656570, "PSTOREFS_MAGIC": 0x6165676c,
        "EFIVARFS_MAGIC": 0xde5e81e4, "BINFMTFS_MAGIC": 0x42494e4d,
        "SELINUX_MAGIC": 0xf97cff8c, "DEVPTS_SUPER_MAGIC": 0x1cd1,
        "MQUEUE_MAGIC": 0x19800202, "FUSE_CTL_SUPER_MAGIC": 0x65735543,
        "NSFS_MAGIC": 0x6e736673,
    }
    assert _KERNEL_FILESYSTEMS == frozenset(magic.values())


def test_a_path_is_first_opened_with_o_path(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """O_PATH runs no device driver and never blocks on a FIFO."""
    import os

    flags: list[int] = []
    real_open = os.open

    def recording(path: str, flag: int, *args: int) -> int:
        flags.append(flag)
        return real_open(path, flag, *args)

    (tmp_path / "k").write_text("v")
    monkeypatch.setattr("supervisor.revision.secrets.os.open", recording)
    assert EnvFileResolver({}).resolve(f"file:{tmp_path / 'k'}") == b"v"
    assert flags[0] & os.O_PATH


def test_without_proc_fd_the_path_is_opened_again_and_must_be_the_file_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from supervisor.revision.secrets import _read_file

    (tmp_path / "k").write_text("v")
    (tmp_path / "swapped").write_text("other")
    real_open = os.open
    opened: list[int] = []
    swap = {"to": str(tmp_path / "k")}

    def no_proc_fd(path: str, flag: int, *args: int) -> int:
        if path.startswith("/proc/self/fd/"):
            raise FileNotFoundError(path)
        fd = real_open(path if flag & os.O_PATH else swap["to"], flag, *args)
        opened.append(fd)
        return fd

    monkeypatch.setattr("supervisor.revision.secrets.os.open", no_proc_fd)
    assert _read_file(str(tmp_path / "k")) == b"v"
    swap["to"] = str(tmp_path / "swapped")
    with pytest.raises(RevisionError) as info:
        _read_file(str(tmp_path / "k"))
    assert "cannot be resolved" in info.value.detail
    for fd in opened:  # the swapped file's descriptor is closed too
        with pytest.raises(OSError):
            os.fstat(fd)


def test_the_daemons_resolver_confines_to_its_config_and_refuses_its_credentials(
        tmp_path: Path) -> None:
    from supervisor.config import Config, ControlPlaneConfig, RevisionConfig

    allowed = tmp_path / "secrets"
    allowed.mkdir()
    token = allowed / "upstream.token"
    token.write_text("upstream-token\n")
    (allowed / "key").write_text("team-secret\n")
    (tmp_path / "outside").write_text("o\n")
    config = Config(control_plane=ControlPlaneConfig(url="https://upstream:9464",
                                                     token_file=str(token)),
                    revision=RevisionConfig(secret_dirs=[str(allowed)]))
    resolver = EnvFileResolver.for_daemon(config, environ={"HOME": str(tmp_path)})
    assert resolver.resolve(f"file:{allowed / 'key'}") == b"team-secret"
    for reference, refusal in ((f"file:{token}", "cannot be resolved"),
                               (f"file:{tmp_path / 'outside'}", "outside [revision].secret_dirs")):
        with pytest.raises(RevisionError) as info:
            resolver.resolve(reference)
        assert refusal in info.value.detail


_HOSTILE = "\x1b[2J\u202e\n" + "n" * 1_000_000  # control characters, a bidi override, 1 MB


def _hostile_documents() -> list[tuple[str, object]]:
    good_alias = {"upstream": "https://a.internal"}
    good_key = {"secret": "env:K", "aliases": ["a"]}
    return [
        ("alias name", {"aliases": {_HOSTILE: good_alias}, "keys": {}}),
        ("long plain alias name", {"aliases": {"x" * 1_000_000: good_alias}, "keys": {}}),
        ("key name", {"aliases": {"a": good_alias}, "keys": {_HOSTILE: good_key}}),
        ("alias listed", {"aliases": {"a": good_alias},
                          "keys": {"k": {"secret": "env:K", "aliases": ["a", _HOSTILE]}}}),
        ("field of an alias", {"aliases": {"a": {**good_alias, _HOSTILE: 1}}, "keys": {}}),
        ("field of the document", {_HOSTILE: 1, "aliases": {}, "keys": {}}),
        ("field of a key", {"aliases": {"a": good_alias},
                            "keys": {"k": {**good_key, _HOSTILE: 1}}}),
        ("secret file", {"aliases": {"a": good_alias},
                         "keys": {"k": {"secret": "file:/\u202e" + "s" * 4000, "aliases": ["a"]}}}),
    ]


@pytest.mark.parametrize(("place", "doc"), _hostile_documents(), ids=lambda v: str(v)[:24])
def test_a_hostile_name_is_quoted_and_bounded_in_the_refusal(place: str, doc: object) -> None:
    top = {"schema_version": 1, **doc}  # type: ignore[dict-item]
    judges = [lambda: compile_revision(json.dumps(top).encode(), revision=3, generation=1,
                                       resolver=EnvFileResolver({}, dirs=["/nonexistent"]))]
    if place != "secret file":  # the document is valid: only resolving it is refused
        judges.append(lambda: document_from_object(top, revision=3))
    for judge in judges:
        with pytest.raises(RevisionError) as info:
            judge()
        detail = info.value.detail
        assert detail.isprintable() and len(detail.encode()) <= DETAIL_BYTES, (place, detail[:300])
        assert "\x1b" not in str(info.value) and len(str(info.value).encode()) <= 2 * DETAIL_BYTES


def test_an_unknown_field_below_the_top_keeps_its_place_and_no_top_level_suggestion() -> None:
    # A name repeated within one object: the typed decode refuses the first, msgspec's
    # own message (its place included) is the detail; "keys" is no field of an alias.
    repeated = (b'{"schema_version": 1, "aliases": {"a": {"upstream": "https://x", "keyz": 1},'
                b' "a": {"upstream": "https://x"}}}')
    with pytest.raises(RevisionError) as info:
        decode_body(repeated)
    assert info.value.detail == "$.aliases[...]: Object contains unknown field `keyz`"
    with pytest.raises(RevisionError) as info:
        decode_body(b'{"schema_version": 1, "keyz": 1}')
    assert info.value.detail == "$: Object contains unknown field `keyz` (did you mean `keys`?)"
