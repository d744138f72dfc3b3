"""Hostile configuration and revision input through the installed console script:
exit 2 with the place named, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.proc import REPO

SCRIPT = Path(sys.executable).parent / "trio-supervisor"


def run(*args: str, env: Mapping[str, str | bytes] | None = None) -> subprocess.CompletedProcess[str]:
    full_env: dict[str | bytes, str | bytes] = {**os.environ, **(env or {})}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=full_env,
                          cwd=REPO, timeout=60, check=False, errors="backslashreplace")


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "supervisor.toml"
    path.write_text(f'[control_plane]\nurl = "sqlite:///{tmp_path}/cp.db"\n{extra}')
    return path


def refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


@pytest.mark.parametrize(
    ("extra", "where", "words"),
    [
        ("poll_interval_s = 1e-300\n", "$.control_plane.poll_interval_s", ">= 0.01"),
        ("[supervisor]\nshutdown_grace_s = inf\n", "$.supervisor.shutdown_grace_s", "finite"),
        ("[kubernetes]\npreflight_retry_s = 5e-324\n", "$.kubernetes.preflight_retry_s",
         ">= 0.1"),
        ("[supervisor]\nrestart_intensity = " + "[" * 2000 + "]" * 2000 + "\n", "$",
         "nested too deeply"),
        ("[supervisor]\nrestart_intensity = " + "9" * 4301 + "\n", "$", "4300 digits"),
    ],
)
def test_check_refuses_with_the_path(tmp_path: Path, extra: str, where: str, words: str) -> None:
    path = config(tmp_path, extra)
    refused(run("check", "--config", str(path)), f"{path}: {where}: ", words)


def test_a_non_utf8_environment_override_is_exit_2(tmp_path: Path) -> None:
    path = config(tmp_path)
    env = {"SUPERVISOR_LOG__LEVEL": b"\xff\xfe"}
    for command in (("check",), ("publish", str(REPO / "conf" / "example-revision.toml"))):
        refused(run(command[0], "--config", str(path), *command[1:], env=env),
                "$.log.level", "SUPERVISOR_LOG__LEVEL", "UTF-8")
    assert not (tmp_path / "cp.db").exists()


@pytest.mark.parametrize(
    ("value", "words"),
    [("[" * 2000 + "]" * 2000, "nested too deeply"), ("9" * 4400, "4300 digits")],
)
def test_publish_refuses_a_revision_file_that_breaks_the_parser(
    tmp_path: Path, value: str, words: str
) -> None:
    document = tmp_path / "rev.toml"
    document.write_text(f'schema_version = 1\n[aliases.chat]\nupstream = "http://a/"\n'
                        f"retries = {value}\n")
    result = run("publish", "--config", str(config(tmp_path)), str(document))
    refused(result, str(document), words, "nothing was stored")
    assert not (tmp_path / "cp.db").exists()


def test_check_prints_every_schema_error_not_only_the_first(tmp_path: Path) -> None:
    path = config(tmp_path, '[log]\nlevel = "loud"\nformat = "xml"\n'
                            '[admin]\nlisten = 5\n[supervisor]\nshutdown_grace_s = -1\n')
    result = run("check", "--config", str(path))
    refused(result, "$.log.level", "$.log.format", "$.admin.listen",
            "$.supervisor.shutdown_grace_s")
    assert len(result.stderr.strip().splitlines()) == 4, result.stderr


def test_check_prints_a_bad_listen_address_beside_a_schema_error(tmp_path: Path) -> None:
    """A value of the right type that a rule of its own refuses ([admin].listen without a
    port) is listed with the type errors of other keys, not only once they are fixed."""
    path = config(tmp_path, '[log]\nlevel = "loud"\n[admin]\nlisten = "nope"\n')
    result = run("check", "--config", str(path))
    refused(result, "$.log.level", "$.admin.listen: expected HOST:PORT, got 'nope'")
    assert len(result.stderr.strip().splitlines()) == 2, result.stderr


def test_an_enum_error_lists_the_choices(tmp_path: Path) -> None:
    result = run("check", "--config", str(config(tmp_path, '[log]\nformat = "xml"\n')))
    refused(result, "$.log.format: must be one of auto, console, journal, json, got 'xml'")


def test_an_environment_override_error_blames_the_variable(tmp_path: Path) -> None:
    path = config(tmp_path)
    result = run("check", "--config", str(path), env={"SUPERVISOR_ADMIN__LISTEN": "nonsense"})
    refused(result, "environment variable SUPERVISOR_ADMIN__LISTEN: $.admin.listen")
    assert f"{path}: $.admin.listen" not in result.stderr


def test_check_strict_exits_2_when_the_signing_key_is_not_trusted(tmp_path: Path) -> None:
    keys = []
    for name in ("signing.key", "other.key"):
        made = run("keygen", "--out", str(tmp_path / name))
        assert made.returncode == 0, made.stderr
        keys.append(made.stdout.strip().split()[-1])
    (tmp_path / "cache").mkdir()
    # Secret references confined, so that the key is the only warning there can be.
    path = config(tmp_path, f'[cache]\npath = "{tmp_path}/cache/lkg.bin"\n'
                            f'signing_key = "{tmp_path}/signing.key"\n'
                            f'trusted_keys = ["{keys[0]}"]\n'
                            '[revision]\nsecret_env_prefixes = ["APP_SECRET_"]\n')
    assert run("check", "--strict", "--config", str(path)).returncode == 0
    env = {"SUPERVISOR_CACHE__SIGNING_KEY": str(tmp_path / "other.key")}
    lenient = run("check", "--config", str(path), env=env)
    assert lenient.returncode == 0 and "would refuse its own cache" in lenient.stderr
    refused(run("check", "--strict", "--config", str(path), env=env),
            "$.cache.signing_key", "would refuse its own cache", "--strict")


def test_a_startup_configuration_error_follows_the_log_format(tmp_path: Path) -> None:
    import json

    path = config(tmp_path, '[log]\nformat = "json"\n[admin]\nlisten = 5\n')
    result = run("run", "--config", str(path))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    doc = json.loads(line)
    assert doc["event"] == "invalid configuration" and doc["level"] == "critical"
    assert doc["key"] == "$.admin.listen" and doc["source"] == str(path)
    journal = run("run", "--config", str(path), env={"SUPERVISOR_LOG__FORMAT": "journal"})
    assert journal.returncode == 2
    assert journal.stderr.startswith("<2>{") and '"invalid configuration"' in journal.stderr
    # The format itself unreadable: the plain line, as before.
    plain = run("run", "--config", str(config(tmp_path, '[log]\nformat = "xml"\n')))
    refused(plain, "trio-supervisor: configuration error:", "$.log.format")


def test_a_misspelt_environment_override_is_warned_of_naming_the_right_one(
        tmp_path: Path) -> None:
    """One underscore where the real name has two: ignored, but never silently."""
    result = run("check", "--config", str(config(tmp_path)),
                 env={"SUPERVISOR_CONTROL_PLANE_URL": "sqlite:///elsewhere.db",
                      "SUPERVISOR_LOG_LEVEL": "debug"})
    assert result.returncode == 0, result.stderr
    assert ("SUPERVISOR_CONTROL_PLANE_URL is not read: did you mean "
            "SUPERVISOR_CONTROL_PLANE__URL?") in result.stderr
    assert "SUPERVISOR_LOG_LEVEL is not read: did you mean SUPERVISOR_LOG__LEVEL?" \
        in result.stderr
    strict = run("check", "--strict", "--config", str(config(tmp_path)),
                 env={"SUPERVISOR_CONTROL_PLANE_URL": "x"})
    assert strict.returncode == 2, strict.stderr


def test_the_shipped_dev_configuration_passes_check_strict(tmp_path: Path) -> None:
    result = run("check", "--strict", "--config", str(REPO / "conf" / "dev.toml"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr


def test_keygen_prints_the_key_id_beside_the_key(tmp_path: Path) -> None:
    from supervisor.sinks.lkg.keys import parse_verify_key

    result = run("keygen", "--out", str(tmp_path / "signing.key"))
    assert result.returncode == 0, result.stderr
    line = result.stdout.splitlines()[-1]
    key_id, _ = parse_verify_key(line.split()[-1])
    assert line.startswith(f"add to [cache].trusted_keys (key id {key_id}): ed25519:"), line
