"""SIGHUP under systemd's ``Type=notify-reload`` (real process, real notify socket).

systemd 253 sends SIGHUP and waits for ``RELOADING=1`` (with ``MONOTONIC_USEC``)
then ``READY=1``; ``systemctl reload`` returns only then. A reload that fails
still ends with ``READY=1``, its STATUS= saying so.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import trio

from tests.proc import EXAMPLE, NotifySocket, cli, free_port, run_daemon, write_config


def _fields(message: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in message.splitlines() if "=" in line)


async def test_sighup_sends_reloading_then_ready_also_when_the_reload_fails(
        tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=free_port())
    cli("publish", "--config", str(config), str(EXAMPLE))
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    try:
        with trio.fail_after(60):
            async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
                await notify.wait_for("READY=1")
                before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
                daemon.signal(signal.SIGHUP)
                reloading = _fields(await notify.wait_for("RELOADING=1"))
                after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
                assert before <= int(reloading["MONOTONIC_USEC"]) <= after
                done = _fields(await notify.wait_for("READY=1"))
                assert done["STATUS"].startswith("reloaded; serving revision")
                # The reload was done by READY=1: its log line was written before it (read
                # here from the daemon's stderr, which may arrive after the datagram).
                with trio.fail_after(5):
                    await daemon.wait_log("SIGHUP: log level set")
                # A configuration that cannot be read: READY=1 all the same, saying so.
                config.unlink()
                os.mkfifo(config, 0o600)
                daemon.signal(signal.SIGHUP)
                await notify.wait_for("RELOADING=1")
                failed = _fields(await notify.wait_for("READY=1"))
                assert failed["STATUS"].startswith("reload failed; configuration not reloaded")
                assert "FIFO" in failed["STATUS"]
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0
    finally:
        notify.close()
