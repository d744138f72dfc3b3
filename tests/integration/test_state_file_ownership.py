"""Files others can write: the snapshot file's place and an SQLite control plane's.

A local user who can create or replace the snapshot file (a sticky world-writable
directory is enough: they create it first, and the daemon can never replace it)
serves local consumers a forged upstream and key; one who can write the SQLite
file or its directory decides the desired revision. ``check`` and the start
refuse both (exit 2, naming the place), the SQLite file is made 0600, and a
snapshot write the file system refuses makes /healthz say so.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from tests.polling import poll_until
from tests.proc import EXAMPLE, REPO, acli, cli, free_port, run_daemon, write_config

NOBODY = 65534
CONFINED = f'[revision]\nsecret_env_prefixes = ["TEAM_"]\nsecret_dirs = ["{REPO}/conf"]\n'

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as `nobody` needs root")


@pytest.fixture
def sticky_dir() -> Iterator[Path]:
    """A directory like /tmp (mode 1777) that the user `nobody` can reach."""
    directory = Path(tempfile.mkdtemp(prefix="tsup-sticky-", dir="/tmp"))
    directory.chmod(0o1777)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def as_nobody(command: str) -> None:
    subprocess.run(["sh", "-c", command], user=NOBODY, group=NOBODY, check=True, timeout=30)


async def test_a_snapshot_file_another_user_created_is_refused_by_check_and_start(
    tmp_path: Path, sticky_dir: Path,
) -> None:
    snapshot = sticky_dir / "snapshot.json"
    as_nobody(f"printf '%s' '{{\"forged\": true}}' > {snapshot}")
    assert snapshot.stat().st_uid == NOBODY
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                          f'{CONFINED}[snapshot]\npath = "{snapshot}"\n')
    cli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(60):
        check = await acli("check", "--config", str(config), check=False)
        assert check.returncode == 2, check
        assert f"$.snapshot.path: the snapshot directory {sticky_dir} has mode 1777" in (
            check.stderr)
        sticky_dir.chmod(0o755)  # the directory is fine now; the file is still nobody's
        check = await acli("check", "--config", str(config), check=False)
        assert check.returncode == 2, check
        assert "$.snapshot.path" in check.stderr and str(snapshot) in check.stderr
        assert f"owned by uid {NOBODY}" in check.stderr
        start = await acli("run", "--config", str(config), check=False, timeout=30)
        assert start.returncode == 2 and f"owned by uid {NOBODY}" in start.stderr, start
        assert snapshot.read_text() == '{"forged": true}'  # never served over: refused
        snapshot.unlink()
        assert (await acli("check", "--config", str(config))).returncode == 0


async def test_the_sqlite_control_plane_is_made_private_and_its_place_checked(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    config = write_config(tmp_path, f"sqlite:///{state}/cp.db", CONFINED)
    old = os.umask(0o022)
    try:
        cli("publish", "--config", str(config), str(EXAMPLE))
    finally:
        os.umask(old)
    for made in state.iterdir():  # cp.db and whatever SQLite kept beside it
        assert stat.S_IMODE(made.stat().st_mode) == 0o600, made
    with trio.fail_after(60):
        assert (await acli("check", "--config", str(config))).returncode == 0
        state.chmod(0o777)
        check = await acli("check", "--config", str(config), check=False)
        assert check.returncode == 2, check
        assert f"$.control_plane.url: the control plane's directory {state} has mode 0777" in (
            check.stderr)
        state.chmod(0o755)
        os.chown(state / "cp.db", NOBODY, -1)
        start = await acli("run", "--config", str(config), check=False, timeout=30)
        assert start.returncode == 2, start
        assert "$.control_plane.url" in start.stderr and f"owned by uid {NOBODY}" in start.stderr


async def test_a_refused_snapshot_write_makes_healthz_name_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                          f'{CONFINED}[snapshot]\npath = "{run}/snapshot.json"\n',
                          port=port, poll_interval_s=0.2)
    cli("publish", "--config", str(config), str(EXAMPLE))

    async def healthz() -> tuple[int, list[str]]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            answer = await http.get("/healthz")
        return answer.status_code, answer.json().get("unhealthy", [])

    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            assert (await healthz())[0] == 200
            # The file system refuses every write there from now on.
            run.rename(tmp_path / "run.moved")
            run.write_text("not a directory")

            async def unhealthy() -> bool:
                return (await healthz())[0] == 503

            await poll_until(unhealthy)
            _, why = await healthz()
            assert any(w.startswith("the snapshot file cannot be written") for w in why), why
            run.unlink()
            run.mkdir(mode=0o755)

            async def healthy() -> bool:
                return (await healthz())[0] == 200

            await poll_until(healthy)
            assert (run / "snapshot.json").exists()
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
