"""``check`` refuses a follower that would trust its own cache key for what its upstream sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.followers import make_node
from tests.proc import acli


async def test_check_exits_2_when_a_follower_trusts_its_own_cache_key_upstream(
    tmp_path: Path
) -> None:
    root = make_node(tmp_path, "root", f"sqlite:///{tmp_path}/cp.db", [])
    good = make_node(tmp_path, "good", root.url, [root.verify_key])
    assert (await acli("check", "--config", str(good.config), check=False)).returncode == 0
    # Its own key among the root's: anyone holding it could forge for it.
    own = make_node(tmp_path, "own", root.url, [root.verify_key])
    own = make_node(tmp_path, "own", root.url, [root.verify_key, own.verify_key])
    result = await acli("check", "--config", str(own.config), check=False)
    assert result.returncode == 2
    assert "$.control_plane.trusted_keys" in result.stdout + result.stderr
    assert "own cache verify key" in result.stdout + result.stderr
    # Follower mode without the root's keys at all.
    none = make_node(tmp_path, "none", root.url, [])
    result = await acli("check", "--config", str(none.config), check=False)
    assert result.returncode == 2 and "$.control_plane.trusted_keys" in result.stderr


@pytest.mark.parametrize(("content", "fragment"), [
    ("tökén\n", "printable ASCII"),
    ("a" * 4097, "4096 bytes"),
    ("\n", "is empty"),
])
async def test_check_and_start_refuse_an_unusable_upstream_token_file_naming_its_key(
    tmp_path: Path, content: str, fragment: str
) -> None:
    root = make_node(tmp_path, "root", f"sqlite:///{tmp_path}/cp.db", [])
    token = tmp_path / "upstream.token"
    token.write_text(content)
    token.chmod(0o600)
    node = make_node(tmp_path, "follower", root.url, [root.verify_key],
                     control_plane=f'token_file = "{token}"')
    checked = await acli("check", "--config", str(node.config), check=False)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "$.control_plane.token_file" in checked.stderr and fragment in checked.stderr
    ran = await acli("run", "--config", str(node.config), check=False, timeout=30)
    assert ran.returncode == 2, ran.stderr
    assert "$.control_plane.token_file" in ran.stderr and fragment in ran.stderr
    assert "$.admin.token_file" not in ran.stderr + checked.stderr
    assert "Traceback" not in ran.stderr
