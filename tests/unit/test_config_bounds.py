"""Configuration bounds and hostile input: every duration is bounded, and nothing a file
or the environment holds ends in anything but a valid configuration or a ConfigError
(exit 2) that names the place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.cli import EXIT_OK, EXIT_USAGE, _report
from supervisor.configchecks import check_files
from supervisor.configfile import load_text
from supervisor.errors import ConfigError
from supervisor.revision.errors import RevisionError
from supervisor.revision.files import load_document_file

# (section, key, smallest accepted, largest accepted, a refused value below)
DURATIONS = [
    ("supervisor", "shutdown_grace_s", 0.1, 3600, 0.09),
    ("supervisor", "restart_period_s", 1, 86400, 0.5),
    ("control_plane", "poll_interval_s", 0.01, 86400, 1e-300),
    ("control_plane", "backoff_initial_s", 0.01, 3600, 5e-324),
    ("control_plane", "backoff_max_s", 0.01, 3600, 0.001),
    ("kubernetes", "preflight_retry_s", 0.1, 86400, 5e-324),
]


def refuse(text: str, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(text, source="t.toml", environ=env or {})
    return info.value


def table(section: str, key: str, value: object) -> str:
    # The other backoff bound at its extreme, so that initial <= max holds.
    extra = {"backoff_max_s": "backoff_initial_s = 0.01\n",
             "backoff_initial_s": "backoff_max_s = 3600\n"}.get(key, "")
    return f"[{section}]\n{extra}{key} = {value}\n"


@pytest.mark.parametrize(("section", "key", "low", "high", "below"), DURATIONS)
def test_every_duration_has_a_named_minimum_and_maximum(
    section: str, key: str, low: float, high: float, below: float
) -> None:
    path = f"$.{section}.{key}"
    load_text(table(section, key, low), environ={})
    load_text(table(section, key, high), environ={})
    for value, bound in ((below, f"{low:g}"), (high * 2, f"{high:g}")):
        exc = refuse(table(section, key, value))
        assert exc.path == path, value
        assert bound in exc.reason and f"{low:g}" in exc.reason and f"{high:g}" in exc.reason
    for value in ("inf", "-inf", "nan", "+nan"):
        exc = refuse(table(section, key, value))
        assert exc.path == path and "finite" in exc.reason, value
    env = {f"SUPERVISOR_{section.upper()}__{key.upper()}": "inf"}
    assert refuse("", env=env).path == path


def test_a_non_finite_number_is_refused_anywhere() -> None:
    exc = refuse("[cache]\ntrusted_keys = [1.0, nan]\n")
    assert exc.path == "$.cache.trusted_keys[1]" and "finite" in exc.reason


def test_a_nul_character_is_refused_with_its_path() -> None:
    exc = refuse('[admin]\ntoken_file = "/etc/a\\u0000b"\n')
    assert exc.path == "$.admin.token_file" and "NUL" in exc.reason


def test_deeply_nested_toml_is_a_config_error() -> None:
    exc = refuse("[supervisor]\nrestart_intensity = " + "[" * 2000 + "]" * 2000 + "\n")
    assert exc.path == "$" and "nested too deeply" in exc.reason


def test_an_integer_of_4300_digits_is_a_config_error() -> None:
    exc = refuse("[log]\nlevel = 'info'\n[supervisor]\nrestart_intensity = " + "9" * 4301 + "\n")
    assert exc.path == "$" and "digits" in exc.reason and "line 4" in exc.reason
    assert "set_int_max_str_digits" not in exc.reason  # advice for programmers, not operators


def test_environment_values_that_are_not_toml_values_are_strings() -> None:
    deep = "[" * 2000
    exc = refuse("", env={"SUPERVISOR_SUPERVISOR__RESTART_INTENSITY": deep})
    assert exc.path == "$.supervisor.restart_intensity"
    exc = refuse("", env={"SUPERVISOR_SUPERVISOR__RESTART_INTENSITY": "9" * 4301})
    assert exc.path == "$.supervisor.restart_intensity"


def test_a_non_utf8_environment_override_is_a_config_error() -> None:
    raw = b"\xff\xfeinfo"
    value = raw.decode("utf-8", "surrogateescape")  # what os.environ holds for those bytes
    exc = refuse("", env={"SUPERVISOR_LOG__LEVEL": value})
    assert exc.path == "$.log.level"
    assert "SUPERVISOR_LOG__LEVEL" in exc.reason and "UTF-8" in exc.reason
    name = "SUPERVISOR_LOG__" + b"\xff".decode("utf-8", "surrogateescape")
    exc = refuse("", env={name: "info"})
    assert exc.path == "$.log" and "UTF-8" in exc.reason


# --------------------------------------------------------------------------- the revision document


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("retries = " + "[" * 2000 + "]" * 2000, "nested too deeply"),
        ("retries = " + "9" * 4400, "digits"),
    ],
)
def test_revision_files_that_break_the_parser_are_refused_with_the_file(
    tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "rev.toml"
    path.write_text(f'schema_version = 1\n[aliases.chat]\nupstream = "http://a/"\n{text}\n')
    with pytest.raises(RevisionError) as info:
        load_document_file(path)
    assert info.value.detail.startswith(str(path)) and words in info.value.detail


# --------------------------------------------------------------------------- properties

_SETTINGS = settings(
    max_examples=int(os.environ.get("CONFIG_FUZZ_EXAMPLES", "300")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_KEYS = [f"{section}__{key}".upper() for section, key, *_ in DURATIONS] + [
    "SUPERVISOR__RESTART_INTENSITY", "LOG__LEVEL", "LOG__FORMAT", "CONTROL_PLANE__URL",
    "CONTROL_PLANE__LISTEN", "CONTROL_PLANE__CHANNEL", "CONTROL_PLANE__MAX_REVISION_BYTES",
    "ADMIN__LISTEN", "ADMIN__TOKEN_FILE", "SNAPSHOT__PATH", "KUBERNETES__ENABLED",
    "KUBERNETES__KUBECONFIG", "NOPE__X", "LOG__NOPE",
]
# What os.environ can hold: any text without NUL, non-UTF-8 bytes as lone surrogates.
_ENV_TEXT = st.one_of(
    st.text(st.characters(exclude_characters="\x00"), max_size=60),
    st.binary(max_size=60).map(
        lambda raw: raw.replace(b"\x00", b"").decode("utf-8", "surrogateescape")),
)
_TOML_VALUES = st.one_of(
    st.integers(), st.floats(), st.booleans(), st.text(max_size=30).map(repr),
    st.sampled_from(["inf", "nan", "-inf", "[]", "[[[[1]]]]", "{a = 1}", "1979-05-27",
                     "'''x'''", '"\\u0000"', "9" * 4301, "[" * 1200 + "]" * 1200]),
).map(str)


def exit_code(text: str, environ: dict[str, str]) -> int:
    """What ``check`` would exit with for this file and environment (in-process, no I/O)."""
    try:
        config = load_text(text, source="p.toml", environ=environ)
        check_files(config)
    except BaseException as exc:  # noqa: BLE001 - mapped exactly as the CLI maps it
        return _report(exc)
    return EXIT_OK


@_SETTINGS
@given(text=st.text(max_size=400))
def test_any_text_is_valid_or_exit_2(text: str) -> None:
    assert exit_code(text, {}) in (EXIT_OK, EXIT_USAGE)


@_SETTINGS
@given(
    tables=st.dictionaries(
        st.sampled_from(["supervisor", "log", "control_plane", "cache", "admin", "kubernetes"]),
        st.dictionaries(st.sampled_from([k.split("__")[1].lower() for k in _KEYS]),
                        _TOML_VALUES, max_size=4),
        max_size=4,
    )
)
def test_any_toml_tables_are_valid_or_exit_2(tables: dict[str, dict[str, str]]) -> None:
    text = "".join(
        f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
        for name, keys in tables.items()
    )
    assert exit_code(text, {}) in (EXIT_OK, EXIT_USAGE)


@_SETTINGS
@given(env=st.dictionaries(st.sampled_from(_KEYS).map(lambda k: "SUPERVISOR_" + k), _ENV_TEXT,
                           max_size=4))
def test_any_environment_override_is_valid_or_exit_2(env: dict[str, str]) -> None:
    assert exit_code("", env) in (EXIT_OK, EXIT_USAGE)


@_SETTINGS
@given(name=_ENV_TEXT, value=_ENV_TEXT)
def test_any_environment_variable_is_valid_or_exit_2(name: str, value: str) -> None:
    assert exit_code("", {"SUPERVISOR_" + name: value}) in (EXIT_OK, EXIT_USAGE)
