"""The real daemon process: signals, exit codes, systemd notify, logs (SQLite default)."""

from __future__ import annotations

import itertools
import json
import signal
import sqlite3
from pathlib import Path

import trio

from tests.proc import EXAMPLE, NotifySocket, cli, free_port, run_daemon, write_config


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/cp.db"


def published(tmp_path: Path, extra: str = "") -> Path:
    config = write_config(tmp_path, sqlite_url(tmp_path), extra)
    out = cli("publish", "--config", str(config), str(EXAMPLE), "--force", "--message", "test")
    assert out.stdout.strip().splitlines()[-1] == "1"
    return config


async def test_ready_status_stopping_and_sigterm_exit_0_within_grace(tmp_path: Path) -> None:
    config = published(tmp_path)
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    with trio.fail_after(30):
        async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
            ready = await notify.wait_for("READY=1")
            assert "STATUS=serving revision 1" in ready
            line = await daemon.wait_log("published", revision=1)
            assert line["child"] == "convergence" and line["level"] == "info"
            assert "timestamp" in line and line["timestamp"].endswith("Z")
            daemon.signal(signal.SIGTERM)
            stopping_at = trio.current_time()
            await notify.wait_for("STOPPING=1")
            code = await daemon.wait()
            took = trio.current_time() - stopping_at
    assert code == 0
    assert took < 5.0  # the configured grace
    assert any(line.get("event") == "stopped" for line in daemon.lines)
    # Every line on stderr is one JSON object.
    assert not [line for line in daemon.lines if line.get("unparsed")]
    notify.close()


async def test_a_second_signal_cancels_at_once(tmp_path: Path) -> None:
    config = published(tmp_path)
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    with trio.fail_after(30):
        async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
            await notify.wait_for("READY=1")
            # Two different signals: trio coalesces a repeated pending signal into one.
            daemon.signal(signal.SIGTERM)
            daemon.signal(signal.SIGINT)
            with trio.fail_after(3):
                code = await daemon.wait()
    assert code == 0
    events = [line.get("event") for line in daemon.lines]
    assert "shutting down" in events
    assert "second signal: cancelling now" in events
    assert events.index("second signal: cancelling now") > events.index("shutting down")
    notify.close()


async def test_watchdog_cadence(tmp_path: Path) -> None:
    config = published(tmp_path)
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "400000"}  # ping every 0.2 s
    with trio.fail_after(30):
        async with run_daemon(config, env=env) as daemon:
            await notify.wait_for("READY=1")
            pings = []
            while len(pings) < 6:
                if "WATCHDOG=1" in await notify.receive():
                    pings.append(notify.messages[-1][0])
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert all(0.1 < gap < 0.4 for gap in gaps), gaps
    notify.close()


async def test_sighup_converges_now_and_rereads_log_level(tmp_path: Path) -> None:
    config = published(tmp_path)
    config = write_config(tmp_path, sqlite_url(tmp_path), poll_interval_s=3600)
    text = config.read_text()
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    with trio.fail_after(30):
        async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
            await notify.wait_for("READY=1")
            cli("publish", "--config", str(config), str(EXAMPLE), "--force")
            config.write_text(text.replace('level = "info"', 'level = "debug"'))
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("SIGHUP: log level set", new_level="debug")
            await daemon.wait_log("published", revision=2)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    notify.close()


async def test_sigterm_during_startup_exits_0(tmp_path: Path) -> None:
    config = published(tmp_path)
    with trio.fail_after(30):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("admin API listening")
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def test_bad_configuration_exits_2_naming_the_path(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[control_plane]\npoll_interval_s = -1\n")
    result = cli("run", "--config", str(config), check=False)
    assert result.returncode == 2
    assert "$.control_plane.poll_interval_s" in result.stderr
    result = cli("check", "--config", str(config), check=False)
    assert result.returncode == 2
    assert "$.control_plane.poll_interval_s" in result.stderr


async def test_check_ok_and_version(tmp_path: Path) -> None:
    config = write_config(tmp_path, sqlite_url(tmp_path))
    assert cli("check", "--config", str(config)).returncode == 0
    assert "trio-supervisor" in cli("--version").stdout


async def test_refuses_to_boot_with_an_empty_store(tmp_path: Path) -> None:
    config = write_config(tmp_path, sqlite_url(tmp_path))
    cli("db", "migrate", "--config", str(config))
    result = cli("run", "--config", str(config), check=False)
    assert result.returncode == 3
    line = json.loads(result.stderr.strip().splitlines()[-1])
    assert line["event"] == "refused to boot" and line["refusal"] == "empty"
    # `reason` carries the label on every line, so `reason="..."` queries find boot refusals.
    assert line["reason"] == "empty" and "publish" in line["detail"]


async def test_refuses_to_boot_on_a_corrupt_revision(tmp_path: Path) -> None:
    config = published(tmp_path)
    with sqlite3.connect(tmp_path / "cp.db") as db:
        db.execute("UPDATE supervisor_revisions SET body = CAST('{\"schema_version\": 1}' AS BLOB)")
    result = cli("run", "--config", str(config), check=False)
    assert result.returncode == 3
    line = json.loads(result.stderr.strip().splitlines()[-1])
    assert line["refusal"] == "corrupt" and line["reason"] == "corrupt"


async def test_refuses_to_boot_on_an_uncompilable_revision(tmp_path: Path) -> None:
    config = write_config(tmp_path, sqlite_url(tmp_path))
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\n[aliases.a]\nupstream = "https://a/"\n'
                   '[keys.k]\nsecret = "env:TSUP_DEFINITELY_UNSET"\naliases = ["a"]\n')
    cli("publish", "--config", str(config), str(bad))
    result = cli("run", "--config", str(config), check=False,
                 env={"TSUP_DEFINITELY_UNSET": ""})
    assert result.returncode == 3
    line = json.loads(result.stderr.strip().splitlines()[-1])
    assert line["refusal"] == "secret" and line["reason"] == "secret"
    assert "TSUP_DEFINITELY_UNSET" in line["detail"]


async def test_publish_refuses_an_invalid_file_and_stores_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path, sqlite_url(tmp_path))
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\n[aliases.a]\nupstream = "gopher://a"\n')
    result = cli("publish", "--config", str(config), str(bad), check=False)
    assert result.returncode == 2
    assert "$.aliases.a.upstream" in result.stderr
    result = cli("run", "--config", str(config), check=False)
    assert result.returncode == 3  # nothing was stored: still empty


async def test_check_reads_the_keys_and_token(tmp_path: Path) -> None:
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.strip().split()[-1]
    token = tmp_path / "token"
    token.write_text("\n")
    good = write_config(
        tmp_path, sqlite_url(tmp_path),
        f'token_file = "{token}"\n[cache]\npath = "{tmp_path}/lkg.bin"\n'
        f'signing_key = "{key}"\ntrusted_keys = ["{verify}"]\n',
    )
    result = cli("check", "--config", str(good), check=False)
    assert result.returncode == 2 and "$.admin.token_file" in result.stderr  # empty token
    token.write_text("t0ken\n")
    assert cli("check", "--config", str(good)).returncode == 0
    bad = good.read_text().replace(verify, "ed25519:not-base64!")
    good.write_text(bad)
    result = cli("check", "--config", str(good), check=False)
    assert result.returncode == 2 and "$.cache.trusted_keys[0]" in result.stderr


async def test_supervisor_config_names_the_file(tmp_path: Path) -> None:
    config = write_config(tmp_path, sqlite_url(tmp_path))
    assert cli("check", env={"SUPERVISOR_CONFIG": str(config)}).returncode == 0
    missing = cli("check", check=False, env={"SUPERVISOR_CONFIG": ""})
    assert missing.returncode == 2 and "SUPERVISOR_CONFIG" in missing.stderr


async def test_environment_override_reaches_the_daemon(tmp_path: Path) -> None:
    config = published(tmp_path)
    # The file says port X; the environment moves the admin API elsewhere.
    other = free_port()
    env = {"SUPERVISOR_ADMIN__LISTEN": f"127.0.0.1:{other}"}
    with trio.fail_after(30):
        async with run_daemon(config, env=env) as daemon:
            line = await daemon.wait_log("admin API listening")
            assert line["address"] == f"127.0.0.1:{other}"
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def test_console_script_is_installed(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    script = shutil.which("trio-supervisor", path=str(Path(sys.executable).parent))
    assert script is not None, "the trio-supervisor console script is not installed"
    config = write_config(tmp_path, sqlite_url(tmp_path))
    result = subprocess.run([script, "check", "--config", str(config)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


async def test_the_boot_extends_the_start_timeout_to_its_own_deadline_before_ready(
        tmp_path: Path) -> None:
    """systemd's TimeoutStartSec cannot kill a boot whose store is slow within its deadlines."""
    from supervisor.configfile import load
    from supervisor.health import boot_deadline_s

    config = published(tmp_path)
    expected = round(boot_deadline_s(load(config).control_plane) * 1_000_000)
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    with trio.fail_after(30):
        async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
            await notify.wait_for("READY=1")
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    texts = [text for _, text in notify.messages]
    ready = next(i for i, text in enumerate(texts) if "READY=1" in text)
    assert any(f"EXTEND_TIMEOUT_USEC={expected}" in text for text in texts[:ready]), texts
    notify.close()
