"""Configuration: paths in errors, environment overrides, cross-field rules, check."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import split_host_port
from supervisor.configchecks import check_files
from supervisor.configfile import load, load_text
from supervisor.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def refuse(text: str, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(text, source="t.toml", environ=env or {})
    return info.value


def test_defaults_match_the_contract() -> None:
    config = load_text("", environ={})
    assert config.supervisor.shutdown_grace_s == 10
    assert config.supervisor.restart_intensity == 5
    assert config.supervisor.restart_period_s == 60
    assert config.log.level == "info" and config.log.format == "auto"
    cp = config.control_plane
    assert (cp.poll_interval_s, cp.listen, cp.channel) == (5, True, "supervisor_desired")
    assert (cp.max_revision_bytes, cp.backoff_initial_s, cp.backoff_max_s) == (16777216, 0.25, 30)
    assert config.admin.listen == "127.0.0.1:9464"
    assert config.kubernetes.enabled is False
    assert config.kubernetes.field_manager == "trio-supervisor"
    assert config.kubernetes.preflight_retry_s == 300


def test_a_typo_names_its_path() -> None:
    exc = refuse("[control_plane]\npoll_intervall_s = 3\n")
    assert exc.path == "$.control_plane.poll_intervall_s"
    assert "unknown key" in exc.reason
    assert "t.toml" in str(exc)


def test_an_unknown_section_names_its_path() -> None:
    assert refuse("[controlplane]\nurl = 'x'\n").path == "$.controlplane"


def test_a_wrong_type_names_its_path() -> None:
    exc = refuse('[control_plane]\npoll_interval_s = "soon"\n')
    assert exc.path == "$.control_plane.poll_interval_s"
    assert "Expected `float`" in exc.reason


def test_a_range_error_names_its_path() -> None:
    exc = refuse("[supervisor]\nshutdown_grace_s = 0\n")
    assert exc.path == "$.supervisor.shutdown_grace_s"
    assert ">= 0.1" in exc.reason and "<= 3600" in exc.reason


def test_bad_enum_value() -> None:
    assert refuse('[log]\nformat = "xml"\n').path == "$.log.format"


def test_invalid_toml() -> None:
    assert "not valid TOML" in refuse("[log\n").reason


def test_environment_override_wins_over_the_file() -> None:
    config = load_text(
        "[control_plane]\npoll_interval_s = 9\nlisten = true\n",
        environ={
            "SUPERVISOR_CONTROL_PLANE__POLL_INTERVAL_S": "2.5",
            "SUPERVISOR_CONTROL_PLANE__LISTEN": "false",
            "SUPERVISOR_CONTROL_PLANE__URL": "postgresql://u@h/db",
            "SUPERVISOR_LOG__LEVEL": "debug",
            "SUPERVISOR_CONFIG": "ignored.toml",
        },
    )
    assert config.control_plane.poll_interval_s == 2.5
    assert config.control_plane.listen is False
    assert config.control_plane.url == "postgresql://u@h/db"
    assert config.log.level == "debug"


def test_environment_override_is_validated_with_its_path() -> None:
    exc = refuse("", env={"SUPERVISOR_SUPERVISOR__RESTART_INTENSITY": "lots"})
    assert exc.path == "$.supervisor.restart_intensity"
    exc = refuse("", env={"SUPERVISOR_NOPE__X": "1"})
    assert exc.path == "$.nope"


def test_environment_list_override() -> None:
    config = load_text(
        "[cache]\npath = '/tmp/x'\nsigning_key = '/tmp/k'\n",
        environ={"SUPERVISOR_CACHE__TRUSTED_KEYS": '["ed25519:a", "ed25519:b"]'},
    )
    assert config.cache.trusted_keys == ["ed25519:a", "ed25519:b"]


def test_non_loopback_admin_requires_a_token_file() -> None:
    exc = refuse('[admin]\nlisten = "0.0.0.0:9464"\n')
    assert exc.path == "$.admin.token_file"
    load_text('[admin]\nlisten = "0.0.0.0:9464"\ntoken_file = "/t"\nallow_plaintext = true\n',
              environ={})
    load_text('[admin]\nlisten = "[::1]:9464"\n', environ={})


def test_a_non_loopback_listener_serves_tls_or_says_it_allows_plaintext() -> None:
    public = '[admin]\nlisten = "0.0.0.0:9464"\ntoken_file = "/t"\n'
    exc = refuse(public)
    assert exc.path == "$.admin.allow_plaintext" and "TLS" in exc.reason
    load_text(public + 'tls_cert_file = "/c"\ntls_key_file = "/k"\n', environ={})
    load_text(public + "allow_plaintext = true\n", environ={})
    assert refuse(public + 'tls_cert_file = "/c"\n').path == "$.admin.tls_key_file"
    assert refuse('[admin]\ntls_key_file = "/k"\n').path == "$.admin.tls_cert_file"
    assert refuse('[admin]\nclient_ca_file = "/ca"\n').path == "$.admin.client_ca_file"
    assert refuse('[admin]\nread_token_file = "/r"\n').path == "$.admin.read_token_file"
    load_text('[admin]\ntoken_file = "/t"\nread_token_file = "/r"\n', environ={})
    follower = '[control_plane]\nurl = "https://hub:9464"\n'
    assert refuse(follower + 'client_cert_file = "/c"\n').path == \
        "$.control_plane.client_key_file"
    assert refuse('[control_plane]\nurl = "http://hub:9464"\nca_file = "/ca"\n').path == \
        "$.control_plane.ca_file"
    assert refuse('[admin]\nallowed_origins = ["http://x/path"]\n').path == \
        "$.admin.allowed_origins[0]"


def test_check_loads_the_tls_files_as_the_daemon_will(tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key, other = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "other.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    ca.issue_cert("x").private_key_pem.write_to_path(str(other))
    leaf.private_key_pem.write_to_path(str(key))
    good = load_text(f'[admin]\ntls_cert_file = "{cert}"\ntls_key_file = "{key}"\n',
                     environ={})
    assert not [p for p in check_files(good) if "tls" in p[0]]
    mismatched = load_text(f'[admin]\ntls_cert_file = "{cert}"\ntls_key_file = "{other}"\n',
                           environ={})
    problems = dict(check_files(mismatched))
    assert "$.admin.tls_cert_file" in problems, problems


def test_bad_listen_and_url() -> None:
    assert refuse('[admin]\nlisten = "nowhere"\n').path == "$.admin.listen"
    assert refuse('[control_plane]\nurl = "mysql://x"\n').path == "$.control_plane.url"


def test_cache_requires_keys() -> None:
    assert refuse('[cache]\npath = "/tmp/lkg"\n').path == "$.cache.trusted_keys"


def test_split_host_port() -> None:
    assert split_host_port("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_host_port("80")


def test_shipped_configurations_are_valid() -> None:
    for name in ("dev.toml", "prod.toml"):
        load(REPO / "conf" / name, environ={})


def test_check_files_reports_missing_files(tmp_path: Path) -> None:
    config = load_text(
        f'[admin]\ntoken_file = "{tmp_path}/missing-token"\n'
        f'[snapshot]\npath = "{tmp_path}/no/such/dir/snap.json"\n',
        environ={},
    )
    problems = dict(check_files(config))
    assert "$.admin.token_file" in problems
    assert "$.snapshot.path" in problems


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "absent.toml", environ={})


@pytest.mark.parametrize(("text", "environ", "message"), [
    ("[control_plane]\npoll_intervall_s = 3\n", {},
     "$.control_plane.poll_intervall_s: unknown key (did you mean `poll_interval_s`?)"),
    ("[contol_plane]\n", {}, "$.contol_plane: unknown key (did you mean `control_plane`?)"),
    ("", {"SUPERVISOR_LOG__LEVLE": "debug"},
     "$.log.levle: unknown key (did you mean `level`?)"),
    ("", {"SUPERVISOR_CONTROLPLANE__URL": "x"}, "(did you mean `control_plane`?)"),
])
def test_unknown_keys_suggest_the_closest_known_one(
        text: str, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(text, environ=environ)
    assert message in str(info.value)


def test_no_suggestion_when_nothing_is_close() -> None:
    with pytest.raises(ConfigError) as info:
        load_text("[log]\nzzz = 1\n", environ={})
    assert str(info.value).endswith("$.log.zzz: unknown key")


@pytest.mark.parametrize(("text", "where", "words"), [
    ('[revision]\nsecret_dirs = ["/run/keys/.."]', "$.revision.secret_dirs[0]", "'..'"),
    ('[revision]\nsecret_dirs = ["/run/keys", "keys/../etc"]', "$.revision.secret_dirs[1]",
     "'..'"),
    ('[admin]\ntoken_file = "/etc/ts/admin.token"\n[revision]\nsecret_dirs = ["/etc/ts"]',
     "$.revision.secret_dirs[0]", "$.admin.token_file"),
    ('[cache]\npath = "var/c"\nsigning_key = "/etc/ts/k/sign.key"\ntrusted_keys = '
     '["ed25519:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="]\n[revision]\n'
     'secret_dirs = ["/etc/ts/"]', "$.revision.secret_dirs[0]", "$.cache.signing_key"),
    ('[revision]\nsecret_env_prefixes = ["SUPERVISOR_"]', "$.revision.secret_env_prefixes[0]",
     "SUPERVISOR_"),
    ('[revision]\nsecret_env_prefixes = ["TEAM_", "SUP"]', "$.revision.secret_env_prefixes[1]",
     "SUPERVISOR_"),
])
def test_secret_places_never_admit_the_daemons_own_credentials(
    text: str, where: str, words: str,
) -> None:
    """A confinement that admits the admin token, the signing key or the daemon's own
    SUPERVISOR_* settings (the DSN and its password) would let a publisher hash them."""
    refused = refuse(text)
    assert refused.path == where, refused
    assert words in str(refused), refused


def test_secret_places_that_stay_apart_are_accepted() -> None:
    config = load_text('[admin]\ntoken_file = "/etc/ts/admin.token"\n[revision]\n'
                       'secret_dirs = ["/etc/ts/keys", "/etc/tsx"]\n'
                       'secret_env_prefixes = ["TRIO_SUPERVISOR_KEY_", "SUPERVISORS_"]')
    assert config.revision.secret_dirs == ["/etc/ts/keys", "/etc/tsx"]
