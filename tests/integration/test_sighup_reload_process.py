"""SIGHUP re-reads the configuration off the event loop (real process, SQLite control plane).

A FIFO at the configuration path is refused without freezing the loop
(``/healthz`` keeps answering within moments, probed every 100 ms); a changed
key that needs a restart is named in one warning line.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import trio
import trio_websocket

from tests.proc import EXAMPLE, cli, free_port, run_daemon, write_config

# The probe cadence the finding was measured with; each answer must come well within it.
PROBE_EVERY_S = 0.1
PROBE_FOR_S = 3.0
ANSWER_WITHIN_S = 0.5


def _published(tmp_path: Path, port: int, **kwargs: float) -> Path:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port, **kwargs)
    cli("publish", "--config", str(config), str(EXAMPLE))
    return config


async def test_fifo_at_the_config_path_does_not_freeze_healthz(tmp_path: Path) -> None:
    port = free_port()
    config = _published(tmp_path, port)
    text = config.read_text()
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            config.unlink()
            os.mkfifo(config, 0o600)
            daemon.signal(signal.SIGHUP)
            slowest = 0.0
            async with httpx.AsyncClient(timeout=ANSWER_WITHIN_S * 4) as client:
                deadline = trio.current_time() + PROBE_FOR_S
                while trio.current_time() < deadline:
                    started = trio.current_time()
                    answer = await client.get(f"http://127.0.0.1:{port}/healthz")
                    took = trio.current_time() - started
                    assert answer.status_code == 200, answer.text
                    slowest = max(slowest, took)
                    await trio.sleep_until(started + PROBE_EVERY_S)
            print(f"slowest /healthz answer with a FIFO at the config path: {slowest * 1000:.1f} ms")
            assert slowest < ANSWER_WITHIN_S, f"slowest /healthz took {slowest:.2f} s"
            line = await daemon.wait_log("SIGHUP: configuration not reloaded")
            assert "FIFO" in line["error"] and str(config) in line["error"]
            # The file back, with a key that only a restart applies and a log level.
            config.unlink()
            config.write_text(text.replace("poll_interval_s = 1.0", "poll_interval_s = 2.0")
                              .replace('level = "info"', 'level = "debug"'))
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("SIGHUP: log level set", new_level="debug")
            line = await daemon.wait_log("SIGHUP: restart needed for")
            assert line["level"] == "warning"
            assert line["keys"] == ["control_plane.poll_interval_s"]
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    restart_lines = [entry for entry in daemon.lines
                     if str(entry.get("event", "")).startswith("SIGHUP: restart needed for")]
    assert len(restart_lines) == 1


def _with_tokens(tmp_path: Path, port: int, full_token: str,
                 read_token: str) -> tuple[Path, Path, Path]:
    """A published daemon's configuration whose admin API takes these two tokens;
    (the configuration, the full token's file, the read token's file)."""
    full, read = tmp_path / "admin.token", tmp_path / "read.token"
    full.write_text(full_token + "\n")
    read.write_text(read_token + "\n")
    config = _published(tmp_path, port)
    config.write_text(config.read_text().replace(
        "[admin]\n", f'[admin]\ntoken_file = "{full}"\nread_token_file = "{read}"\n'))
    return config, full, read


async def test_sighup_reloads_both_token_files_and_the_old_tokens_are_refused(
        tmp_path: Path) -> None:
    port = free_port()
    config, full, read = _with_tokens(tmp_path, port, "old-full-token", "old-read-token")
    base = f"http://127.0.0.1:{port}"

    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    with trio.fail_after(60):
        async with run_daemon(config) as daemon, httpx.AsyncClient(timeout=10) as client:
            await daemon.wait_log("ready")
            assert (await client.get(f"{base}/status", headers=bearer("old-read-token"))
                    ).status_code == 200
            # Both files replaced (a rename, as a secret manager does), then SIGHUP.
            for path, token in ((full, "new-full-token"), (read, "new-read-token")):
                fresh = path.with_suffix(".new")
                fresh.write_text(token + "\n")
                fresh.replace(path)
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("SIGHUP: tokens reloaded")
            for token in ("old-full-token", "old-read-token"):
                assert (await client.get(f"{base}/status", headers=bearer(token))
                        ).status_code == 401
            assert (await client.post(f"{base}/v1/converge", headers=bearer("old-full-token"))
                    ).status_code == 401
            assert (await client.get(f"{base}/status", headers=bearer("new-read-token"))
                    ).status_code == 200
            assert (await client.post(f"{base}/v1/converge", headers=bearer("new-full-token"))
                    ).status_code == 200
            # An unusable file keeps the tokens in force (the error logged).
            full.write_text("")
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("SIGHUP: tokens not reloaded; the previous tokens stay in force")
            assert (await client.post(f"{base}/v1/converge", headers=bearer("new-full-token"))
                    ).status_code == 200
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def test_a_stream_opened_with_a_token_sighup_retired_is_closed_and_the_others_stay(
        tmp_path: Path) -> None:
    port = free_port()
    config, _, read = _with_tokens(tmp_path, port, "kept-full-token", "old-read-token")
    url = f"ws://127.0.0.1:{port}/v1/stream"

    def bearer(token: str) -> list[tuple[str, str]]:
        return [("Authorization", f"Bearer {token}")]

    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            async with trio_websocket.open_websocket_url(
                    url, extra_headers=bearer("old-read-token")) as retired, \
                    trio_websocket.open_websocket_url(
                        url, extra_headers=bearer("kept-full-token")) as kept:
                await retired.get_message()
                await kept.get_message()
                read.write_text("new-read-token\n")
                daemon.signal(signal.SIGHUP)
                await daemon.wait_log("SIGHUP: tokens reloaded")
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                    while True:
                        await retired.get_message()
                assert closed.value.reason is not None
                assert closed.value.reason.code == 1008, closed.value.reason
                assert not kept.closed
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
