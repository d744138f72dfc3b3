"""The signed last-known-good cache through the real process (PostgreSQL control plane)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import nacl.signing
import pytest
import trio

from supervisor.sinks import lkg
from tests.cacheprocess import cache_config, keys, serve_once_and_stop
from tests.pgfaults import alter_database
from tests.proc import EXAMPLE, Daemon, NotifySocket, acli, cli, free_port, run_daemon, write_config
from tests.tcpproxy import TcpProxy, pg_proxy
from tests.tcpproxy import proxied_url as proxied


@dataclass
class Cached:
    """A replica's config whose control plane is behind ``proxy`` on ``port``."""

    key: Path
    verify: str
    port: int
    config: Path
    proxy: TcpProxy


@asynccontextmanager
async def cache_written(tmp_path: Path, pg_url: str, *, force: bool = True,
                        admin_port: int | None = None) -> AsyncIterator[Cached]:
    """Revision 1 published and served once, so the signed cache holds it; the proxy still up."""
    key, verify = keys(tmp_path)
    port = free_port()
    config = cache_config(tmp_path, proxied(pg_url, port), key, [verify], admin_port=admin_port)
    async with pg_proxy(port, pg_url) as proxy:
        await acli("db", "migrate", "--config", str(config))
        await acli("publish", "--config", str(config), str(EXAMPLE), *(["--force"] * force))
        await serve_once_and_stop(config)
        yield Cached(key, verify, port, config, proxy)


@asynccontextmanager
async def ready_daemon(tmp_path: Path, config: Path) -> AsyncIterator[Daemon]:
    """The daemon run with a NOTIFY_SOCKET, once it has said READY=1."""
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
        await notify.wait_for("READY=1")
        yield daemon
    notify.close()


def refusal(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The last log line of a run that refused to boot."""
    return dict(json.loads(result.stderr.strip().splitlines()[-1]))


async def test_keygen(tmp_path: Path) -> None:
    key, verify = keys(tmp_path)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert verify.startswith("ed25519:")
    again = cli("keygen", "--out", str(key), check=False)
    assert again.returncode == 1


async def test_boot_from_cache_when_unreachable_then_converge(tmp_path: Path, pg_url: str) -> None:
    admin_port = free_port()
    async with cache_written(tmp_path, pg_url, admin_port=admin_port) as cached:
        config, proxy = cached.config, cached.proxy
        assert (tmp_path / "cache" / "lkg.bin").exists()
        proxy.stop()
        with trio.fail_after(60):
            async with ready_daemon(tmp_path, config) as daemon:
                line = await daemon.wait_log("serving the last-known-good cache")
                assert line["revision"] == 1 and line["cause"] == "unavailable"
                async with httpx.AsyncClient() as client:
                    status = (await client.get(f"http://127.0.0.1:{admin_port}/status")).json()
                    assert status["revision"]["source"] == "last_known_good"
                    assert status["revision"]["active"] == 1
                    # The control plane comes back with a newer revision.
                    await proxy.start()
                    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
                    await daemon.wait_log("published", revision=2, source="control_plane")
                    status = (await client.get(f"http://127.0.0.1:{admin_port}/status")).json()
                    assert status["revision"]["source"] == "control_plane"
                    assert status["revision"]["active"] == 2
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0


def _tamper_body(data: bytes) -> bytes:
    return data[:-2] + bytes([data[-2] ^ 0x01]) + data[-1:]


def _tamper_header(data: bytes) -> bytes:
    at = data.index(b'"generation":') + len(b'"generation":')
    return data[:at] + b"9" + data[at + 1:]


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_tamper_body, "corrupt"),
        (_tamper_header, "denied"),
        (_truncate, "corrupt"),
    ],
)
async def test_damaged_cache_refuses_to_boot(tmp_path: Path, pg_url: str, damage, words) -> None:  # type: ignore[no-untyped-def]
    async with cache_written(tmp_path, pg_url) as cached:
        config = cached.config
        cached.proxy.stop()
        cache = tmp_path / "cache" / "lkg.bin"
        cache.write_bytes(damage(cache.read_bytes()))
        result = await acli("run", "--config", str(config), check=False)
    assert result.returncode == 3
    line = refusal(result)
    assert line["refusal"] == "cache" and line["reason"] == "cache"
    assert "last-known-good cache" in line["detail"] and words in line["detail"]


async def test_unknown_key_and_rollback_refuse_to_boot(tmp_path: Path, pg_url: str) -> None:
    _, other = keys(tmp_path, "other.key")
    async with cache_written(tmp_path, pg_url) as cached:
        key, verify, port = cached.key, cached.verify, cached.port
        cached.proxy.stop()
        # Unknown key: the file was signed by a key this configuration does not trust.
        untrusting = cache_config(tmp_path, proxied(pg_url, port), key, [other])
        result = await acli("run", "--config", str(untrusting), check=False)
        assert result.returncode == 3
        assert "denied" in refusal(result)["detail"]
        # Rollback: this replica already served a later revision than the cache holds.
        config = cache_config(tmp_path, proxied(pg_url, port), key, [verify])
        (tmp_path / "cache" / "lkg.bin.served").write_text("5\n")
        result = await acli("run", "--config", str(config), check=False)
        assert result.returncode == 3
        assert "rollback" in refusal(result)["detail"]


async def test_cache_from_a_newer_format_is_reported_as_skew(tmp_path: Path, pg_url: str) -> None:
    key, verify = keys(tmp_path)
    port = free_port()  # nothing listens: unreachable
    config = cache_config(tmp_path, proxied(pg_url, port), key, [verify])
    signing = lkg.load_signing_key(str(key))
    key_id = lkg.key_id_of(signing.verify_key)
    body = json.dumps({"schema_version": 1, "aliases": {}}).encode()
    header = lkg.encode_header(revision=3, generation=1, schema_version=1,
                               created_at=datetime.now(UTC), body=body, key_id=key_id,
                               format_version=lkg.FORMAT_VERSION + 1)
    (tmp_path / "cache" / "lkg.bin").write_bytes(lkg.encode_file(header, body, signing))
    result = await acli("run", "--config", str(config), check=False)
    assert result.returncode == 3
    assert "skew" in result.stderr
    assert isinstance(signing, nacl.signing.SigningKey)


async def test_unwritable_cache_directory_keeps_serving_with_one_warning(
    tmp_path: Path, pg_url: str
) -> None:
    key, verify = keys(tmp_path)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory should be")
    config = write_config(
        tmp_path, pg_url,
        f'[cache]\npath = "{blocker}/lkg.bin"\nsigning_key = "{key}"\n'
        f"trusted_keys = {json.dumps([verify])}\n",
    )
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            await daemon.wait_log("published", revision=2)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    warnings = [line for line in daemon.lines
                if line.get("event", "").startswith("sink write failed")]
    assert len(warnings) == 1 and warnings[0]["sink"] == "cache"


async def test_fifo_at_the_cache_path_refuses_to_boot_promptly(tmp_path: Path, pg_url: str) -> None:
    key, verify = keys(tmp_path)
    port = free_port()  # nothing listens: the control plane is unreachable
    config = cache_config(tmp_path, proxied(pg_url, port), key, [verify])
    cache = tmp_path / "cache" / "lkg.bin"
    os.mkfifo(cache, 0o600)
    started = time.monotonic()
    result = await acli("run", "--config", str(config), check=False, timeout=30)
    took = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    line = refusal(result)
    # reason carries the label; the prose (path, what is there) is in detail.
    assert line["refusal"] == "cache" and line["reason"] == "cache"
    assert str(cache) in line["detail"] and "FIFO" in line["detail"]
    assert "corrupt" in line["detail"]
    assert took < 20, f"took {took:.1f} s"


async def test_deleted_served_mark_refuses_to_boot_from_the_cache(
    tmp_path: Path, pg_url: str
) -> None:
    async with cache_written(tmp_path, pg_url) as cached:
        config = cached.config
        cached.proxy.stop()
        mark = tmp_path / "cache" / "lkg.bin.served"
        mark.unlink()
        result = await acli("run", "--config", str(config), check=False)
        assert result.returncode == 3
        detail = refusal(result)["detail"]
        assert "rollback" in detail and str(mark) in detail
        # The deliberate reset the message describes.
        mark.write_text("1\n")
        with trio.fail_after(60):
            async with ready_daemon(tmp_path, config) as daemon:
                line = await daemon.wait_log("serving the last-known-good cache")
                assert line["revision"] == 1
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0


async def test_unsafe_cache_directory_is_refused_by_check_and_boot(
    tmp_path: Path, pg_url: str
) -> None:
    key, verify = keys(tmp_path)
    config = cache_config(tmp_path, pg_url, key, [verify])
    directory = tmp_path / "cache"
    directory.chmod(0o777)
    for command in ("check", "run"):
        result = await acli(command, "--config", str(config), check=False)
        assert result.returncode == 2, (command, result.stderr)
        assert "$.cache.path" in result.stderr and str(directory) in result.stderr
        assert "0777" in result.stderr and "Traceback" not in result.stderr
    directory.chmod(0o700)
    assert (await acli("check", "--config", str(config))).returncode == 0


async def test_check_creates_a_missing_cache_directory_private(
    tmp_path: Path, pg_url: str
) -> None:
    key, verify = keys(tmp_path)
    config = write_config(
        tmp_path, pg_url,
        f'[cache]\npath = "{tmp_path}/state/cache/lkg.bin"\nsigning_key = "{key}"\n'
        f"trusted_keys = {json.dumps([verify])}\n",
    )
    result = await acli("check", "--config", str(config), check=False)
    assert result.returncode == 0, result.stderr
    for directory in (tmp_path / "state", tmp_path / "state" / "cache"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


async def test_idle_in_transaction_timeout_at_boot_serves_the_cache(
    tmp_path: Path, pg_url: str
) -> None:
    # A session the server ends for idling inside a transaction (25P03) is a
    # timeout, like statement_timeout: the control plane cannot answer, so a
    # valid signed cache serves, never exit 3.
    async with cache_written(tmp_path, pg_url, force=False) as cached:
        config, proxy = cached.config, cached.proxy
        await alter_database(pg_url, "idle_in_transaction_session_timeout", "1ms")
        # A database 20 ms away: every transaction idles between its statements
        # for longer than the timeout, on any machine.
        proxy.latency_s = 0.02
        with trio.fail_after(60):
            async with run_daemon(config) as daemon:
                line = await daemon.wait_log("serving the last-known-good cache")
                assert line["revision"] == 1 and line["cause"] == "unavailable"
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0
