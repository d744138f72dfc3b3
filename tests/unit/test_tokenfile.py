"""The one reader of token files (admin, read-only, upstream): bounded, one printable token."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.bounds import DETAIL_BYTES
from supervisor.errors import ConfigError
from supervisor.tokenfile import MAX_TOKEN_FILE_BYTES, read_token
from tests import needs

ADMIN = "$.admin.token_file"


def test_read_token_strips_whitespace(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  abc.DEF-123_~+/=\n\n")
    assert read_token(str(path), ADMIN) == "abc.DEF-123_~+/="


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("", "is empty"),
        (" \n\t\n", "is empty"),
        ("two words", "printable ASCII without spaces"),
        ("tökén", "printable ASCII"),
        ("a\x00b", "printable ASCII"),
    ],
)
def test_read_token_refuses(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        read_token(str(path), ADMIN)
    assert info.value.path == "$.admin.token_file"
    assert fragment in info.value.reason
    # The message names the file, never its content.
    if content.strip():
        assert content.strip() not in str(info.value)


def test_read_token_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read_token(str(tmp_path / "missing"), ADMIN)
    assert info.value.path == "$.admin.token_file"
    assert "cannot read" in info.value.reason
    with pytest.raises(ConfigError):
        read_token(str(tmp_path), ADMIN)  # a directory
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError) as info:
        read_token(str(binary), ADMIN)
    assert "not UTF-8" in info.value.reason


def test_read_token_permission_denied(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc")
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(ConfigError) as info:
            read_token(str(path), ADMIN)
        assert info.value.path == "$.admin.token_file"
        assert "Permission denied" in info.value.reason
        return
    # Root reads any file: the same read in a child without the two capabilities that
    # bypass file modes, so CI (which runs as root) runs this test too.
    setpriv = needs.program("setpriv", "util-linux")
    probe = (
        "import sys\n"
        "from supervisor.tokenfile import read_token\n"
        "from supervisor.errors import ConfigError\n"
        "try:\n"
        "    read_token(sys.argv[1], '$.admin.token_file')\n"
        "except ConfigError as exc:\n"
        "    print(exc.path, exc.reason, sep='|')\n"
    )
    result = subprocess.run(
        [setpriv, "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c", probe,
         str(path)],
        capture_output=True, text=True, timeout=60, check=True)
    where, _, reason = result.stdout.strip().partition("|")
    assert where == "$.admin.token_file"
    assert "Permission denied" in reason


@pytest.mark.parametrize("where", ["$.admin.token_file", "$.admin.read_token_file",
                                   "$.control_plane.token_file"])
def test_a_file_over_4096_bytes_is_refused_naming_the_key_the_file_and_the_bound(
    tmp_path: Path, where: str
) -> None:
    assert MAX_TOKEN_FILE_BYTES == 4096
    path = tmp_path / "token"
    path.write_text("a" * 4095 + "\n")  # exactly the bound, newline included
    assert read_token(str(path), where) == "a" * 4095
    path.write_text("a" * 4096 + "\n")
    with pytest.raises(ConfigError) as info:
        read_token(str(path), where)
    assert info.value.path == where
    assert f"{path} holds more than 4096 bytes" in info.value.reason
    assert "a" * 100 not in str(info.value)


async def test_an_endless_file_is_refused_at_once() -> None:
    # At most one byte past the bound is read: /dev/zero never ends.
    with trio.fail_after(10):
        with pytest.raises(ConfigError) as info:
            await trio.to_thread.run_sync(read_token, "/dev/zero", ADMIN,
                                          abandon_on_cancel=True)
    assert "/dev/zero holds more than 4096 bytes" in info.value.reason


@pytest.mark.parametrize("content", ["\u2028token", "token\u00a0", "\u3000token\n"])
def test_only_ascii_whitespace_is_stripped(tmp_path: Path, content: str) -> None:
    # Unicode spaces around a token are not silently dropped: the file is refused.
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        read_token(str(path), ADMIN)
    assert "printable ASCII" in info.value.reason


_CONTENTS = (st.binary(max_size=64)
             | st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1,
                       max_size=64).map(lambda t: f" {t}\n".encode())
             | st.integers(min_value=4090, max_value=4100).map(lambda n: b"a" * n))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_CONTENTS)
def test_any_file_gives_one_printable_token_or_a_configuration_error(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    try:
        token = read_token(str(path), ADMIN)
    except ConfigError as exc:
        assert exc.path == ADMIN and exc.reason
        secret = content.strip(b" \t\n\r\f\v")
        assert len(secret) < 4 or secret not in str(exc).encode("utf-8", "surrogateescape")
    else:
        assert 0 < len(token) <= MAX_TOKEN_FILE_BYTES
        assert all("!" <= c <= "~" for c in token)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["/", "a", ".", "\x00", "\x1b", "\n", "\ud800", "\udcff", "é",
                                 "x" * 5000]), max_size=8).map("".join))
def test_any_path_gives_a_configuration_error_naming_it_bounded(path: str) -> None:
    # A path from the configuration or the command line: a NUL, a surrogate that is no
    # byte of argv, or a name past PATH_MAX is refused like a file that cannot be read.
    try:
        read_token(path or "/nonexistent", ADMIN)
    except ConfigError as exc:
        assert exc.path == ADMIN
        assert str(exc).isprintable() and len(str(exc).encode()) <= 2 * DETAIL_BYTES
    else:
        raise AssertionError(f"{path!a} read as a token")
