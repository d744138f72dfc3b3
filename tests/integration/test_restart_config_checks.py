"""A child restart does not turn boot-time configuration checks into fatal ones, through the real process.

The convergence child builds its cache on every start, and the cache's
constructor refuses an unsafe directory with ConfigError, which is fatal in the
tree. A cache directory that became group-writable while the replica served (a
deploy tool's chmod, a shared volume's fsGroup) plus a later crash of the
convergence child must not end the process with exit 2 (which the systemd
unit's RestartPreventExitStatus=2 would keep down for good): the child restarts
and the replica keeps serving.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import trio

from tests.proc import EXAMPLE, acli, cli, free_port, run_daemon, write_config


async def test_convergence_restart_survives_a_cache_directory_chmod(tmp_path: Path) -> None:
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    faults = tmp_path / "faults"
    faults.mkdir()
    cache_dir = tmp_path / "cache"
    config = write_config(
        tmp_path, f"sqlite:///{tmp_path / 'cp.db'}", port=free_port(), poll_interval_s=0.2,
        extra=f'[cache]\npath = "{cache_dir / "lkg.bin"}"\nsigning_key = "{key}"\n'
              f'trusted_keys = ["{verify}"]\n')
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config, env={"SUPERVISOR_TEST_FAULT_DIR": str(faults)}) as daemon:
            await daemon.wait_log("ready")
            os.chmod(cache_dir, 0o770)
            (faults / "crash-convergence").write_text("")
            daemon.signal(signal.SIGUSR2)
            await daemon.wait_log("restarting child", child="convergence")
            with trio.move_on_after(5):
                code = await daemon.wait()
                raise AssertionError(
                    f"a convergence restart after the cache directory became 0770 ended the "
                    f"serving process with exit {code}: {daemon.raw[-1][:300]}")
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            await daemon.wait_log("published", revision=2)
