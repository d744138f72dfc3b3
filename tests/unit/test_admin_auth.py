"""Token file reading and bearer comparison."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.admin.auth import authorized, read_token
from supervisor.admin.server import read_token as read_token_from_server
from supervisor.errors import ConfigError
from tests import needs


def test_read_token_strips_whitespace(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  abc.DEF-123_~+/=\n\n")
    assert read_token(str(path)) == "abc.DEF-123_~+/="
    assert read_token_from_server is read_token


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
        read_token(str(path))
    assert info.value.path == "$.admin.token_file"
    assert fragment in info.value.reason
    # The message names the file, never its content.
    if content.strip():
        assert content.strip() not in str(info.value)


def test_read_token_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read_token(str(tmp_path / "missing"))
    assert info.value.path == "$.admin.token_file"
    assert "cannot read" in info.value.reason
    with pytest.raises(ConfigError):
        read_token(str(tmp_path))  # a directory
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError) as info:
        read_token(str(binary))
    assert "not UTF-8" in info.value.reason


def test_read_token_permission_denied(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc")
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(ConfigError) as info:
            read_token(str(path))
        assert info.value.path == "$.admin.token_file"
        assert "Permission denied" in info.value.reason
        return
    # Root reads any file: the same read in a child without the two capabilities that
    # bypass file modes, so CI (which runs as root) runs this test too.
    setpriv = needs.program("setpriv", "util-linux")
    probe = (
        "import sys\n"
        "from supervisor.admin.auth import read_token\n"
        "from supervisor.errors import ConfigError\n"
        "try:\n"
        "    read_token(sys.argv[1])\n"
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


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ([(b"authorization", b"Bearer tok")], True),
        ([(b"authorization", b"bearer tok")], True),
        ([(b"authorization", b"BEARER   tok  ")], True),
        ([(b"Authorization", b"Bearer tok")], True),
        ([(b"authorization", b"Bearer tok2")], False),
        ([(b"authorization", b"Bearer to")], False),
        ([(b"authorization", b"Bearer")], False),
        ([(b"authorization", b"Basic tok")], False),
        ([(b"authorization", b"tok")], False),
        ([(b"authorization", b"Bearer \xfftok")], False),
        ([], False),
        ([(b"authorization", b"Bearer tok"), (b"authorization", b"Bearer tok")], False),
        ([(b"x-token", b"tok")], False),
    ],
)
def test_authorized(headers: list[tuple[bytes, bytes]], ok: bool) -> None:
    assert authorized(headers, "tok") is ok
