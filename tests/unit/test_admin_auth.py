"""Bearer comparison, and the admin API's two token files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.admin.auth import admin_tokens, authorized
from supervisor.errors import ConfigError


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


def test_admin_tokens_name_each_file_s_own_key(tmp_path: Path) -> None:
    full, read = tmp_path / "full", tmp_path / "read"
    full.write_text("full-token\n")
    read.write_text("tökén\n")
    assert admin_tokens(str(full), None) == ("full-token", None)
    with pytest.raises(ConfigError) as info:
        admin_tokens(str(full), str(read))
    assert info.value.path == "$.admin.read_token_file"
    with pytest.raises(ConfigError) as info:
        admin_tokens(str(read), None)
    assert info.value.path == "$.admin.token_file"
    read.write_text("full-token")
    with pytest.raises(ConfigError) as info:
        admin_tokens(str(full), str(read))
    assert info.value.path == "$.admin.read_token_file" and "same token" in info.value.reason


_AUTH_VALUES = st.lists(st.sampled_from([
    b"Bearer", b"bearer", b"BEARER", b"Basic", b" ", b"\t", b"tok", b"to", b"tok2", b"\xff",
    b"\x00", b",", b"="]), max_size=6).map(b"".join) | st.binary(max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"authorization", b"Authorization", b"x-token"]),
                          _AUTH_VALUES), max_size=3))
def test_any_authorization_headers_pass_only_as_exactly_one_bearer_of_the_token(
    headers: list[tuple[bytes, bytes]]
) -> None:
    ok = authorized(headers, "tok")
    values = [v for n, v in headers if n.lower() == b"authorization"]
    scheme, _, credentials = values[0].strip().partition(b" ") if len(values) == 1 else (b"",) * 3
    assert ok == (scheme.lower() == b"bearer" and credentials.strip() == b"tok")
