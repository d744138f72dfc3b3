"""Configuration of fleets: follower mode's url and token_file, listen_url."""

from __future__ import annotations

import pytest

from supervisor.configfile import load_text
from supervisor.errors import ConfigError

KEY = 'trusted_keys = ["ed25519:' + "A" * 43 + '="]'


def refuse(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(text, source="t.toml", environ={})
    return info.value


def test_follower_url_needs_the_roots_trusted_keys_and_a_bare_address() -> None:
    config = load_text(f'[control_plane]\nurl = "https://hub:9464"\n{KEY}\n', environ={})
    assert config.control_plane.backend == "follower"
    assert (config.control_plane.fetch_timeout_s, config.control_plane.hint_min_interval_s,
            config.cache.statement_ttl_s) == (10.0, 0.1, 300.0)
    # The cache's keys are this replica's own: they never vouch for what the upstream sends.
    error = refuse(f'[control_plane]\nurl = "http://hub:9464"\n[cache]\n{KEY}\n')
    assert error.path == "$.control_plane.trusted_keys"
    for url in ("http://hub", "http://hub:9464/v1/revision", "http://u:p@hub:9464"):
        error = refuse(f'[control_plane]\nurl = "{url}"\n{KEY}\n')
        assert error.path == "$.control_plane.url", url
    error = refuse(f'[control_plane]\nurl = "postgresql://db/cp"\n{KEY}\n')
    assert error.path == "$.control_plane.trusted_keys"


def test_statement_ttl_goes_down_to_one_second_and_no_lower() -> None:
    config = load_text('[cache]\nstatement_ttl_s = 1\n', environ={})
    assert config.cache.statement_ttl_s == 1.0
    assert refuse('[cache]\nstatement_ttl_s = 0.5\n').path == "$.cache.statement_ttl_s"


def test_token_file_only_in_follower_mode_and_listen_url_only_on_postgresql() -> None:
    assert refuse('[control_plane]\nurl = "postgresql://db/cp"\ntoken_file = "/t"\n').path == (
        "$.control_plane.token_file")
    config = load_text('[control_plane]\nurl = "postgresql://pgbouncer:6432/cp"\n'
                       'listen_url = "postgresql://db:5432/cp"\n', environ={})
    assert config.control_plane.listen_dsn == "postgresql://db:5432/cp"
    assert refuse('[control_plane]\nurl = "sqlite:///x.db"\n'
                  'listen_url = "postgresql://db/cp"\n').path == "$.control_plane.listen_url"
