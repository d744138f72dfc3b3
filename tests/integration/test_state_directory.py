"""The embedded default makes its own state directory (supervisor/statedirs.py).

Through the real process, in a directory holding only a copy of ``conf/`` (what
a fresh clone has): ``check`` passes and creates nothing; ``run`` makes ``var/``
(mode 0700, logged) but never the SQLite file, so it still refuses to boot
until ``publish`` has made it; after the publish the daemon serves and writes
its snapshot there. A relative directory that cannot be made is refused with
exit 2 naming the key and the path; an absolute one is left to the deployment.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import trio

from tests.proc import REPO, Daemon, free_port, run_daemon

CONF = REPO / "conf"


def fresh_clone(tmp_path: Path) -> Path:
    """A working directory like a fresh clone's: ``conf/`` and no ``var/``."""
    root = tmp_path / "clone"
    root.mkdir()
    shutil.copytree(CONF, root / "conf")
    return root


def environment(port: int) -> dict[str, str]:
    # conf/dev.toml as shipped, but on a free port and in JSON lines.
    return {**os.environ, "PYTHONUNBUFFERED": "1",
            "SUPERVISOR_ADMIN__LISTEN": f"127.0.0.1:{port}", "SUPERVISOR_LOG__FORMAT": "json"}


def cli_in(cwd: Path, *args: str, env: Mapping[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=cwd,
                          env=dict(env or os.environ), capture_output=True, text=True,
                          timeout=60, check=False)


def daemon_in(cwd: Path, env: Mapping[str, str]) -> AbstractAsyncContextManager[Daemon]:
    """The README's first command's daemon, run from ``cwd`` (a fresh clone)."""
    return run_daemon(Path("conf/dev.toml"), args=("run",), env=env, cwd=cwd)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_readme_commands_work_in_a_fresh_clone(tmp_path: Path) -> None:
    root = fresh_clone(tmp_path)
    env = environment(free_port())
    var = root / "var"

    checked = await trio.to_thread.run_sync(
        lambda: cli_in(root, "check", "--config", "conf/dev.toml", env=env))
    assert checked.returncode == 0, checked.stderr
    assert "configuration OK" in checked.stdout
    assert not var.exists(), "check creates nothing"

    with trio.fail_after(60):
        # Nothing published yet: the daemon makes the directory, never the database.
        async with daemon_in(root, env) as daemon:
            created = await daemon.wait_log("created state directory")
            assert created["key"] == "$.control_plane.url"
            assert created["path"] == str(var) and created["mode"] == "0700"
            refused = await daemon.wait_log("refused to boot")
            assert "var/controlplane.db does not exist" in refused["detail"]
            assert await daemon.wait() == 3
        assert var.is_dir() and mode(var) & 0o077 == 0
        assert list(var.iterdir()) == [], "the daemon never creates the control-plane file"

        published = await trio.to_thread.run_sync(lambda: cli_in(
            root, "publish", "--config", "conf/dev.toml", "conf/example-revision.toml", env=env))
        assert published.returncode == 0, published.stderr

        async with daemon_in(root, env) as daemon:
            await daemon.wait_log("ready")
            assert not [line for line in daemon.lines
                        if line.get("event") == "created state directory"], "var/ existed"
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0, "\n".join(daemon.raw)
    assert (var / "snapshot.json").is_file()


async def test_publish_makes_the_directory_of_the_control_plane_file(tmp_path: Path) -> None:
    root = fresh_clone(tmp_path)
    result = await trio.to_thread.run_sync(lambda: cli_in(
        root, "publish", "--config", "conf/dev.toml", "conf/example-revision.toml"))
    assert result.returncode == 0, result.stderr
    assert (root / "var" / "controlplane.db").is_file()
    assert mode(root / "var") & 0o077 == 0


async def test_every_missing_level_is_made_and_an_existing_directory_is_left_alone(
        tmp_path: Path) -> None:
    root = fresh_clone(tmp_path)
    (root / "var").mkdir(mode=0o755)
    os.chmod(root / "var", 0o755)  # the umask may have narrowed it
    env = {**environment(free_port()), "SUPERVISOR_SNAPSHOT__PATH": "state/run/snapshot.json"}
    published = await trio.to_thread.run_sync(lambda: cli_in(
        root, "publish", "--config", "conf/dev.toml", "conf/example-revision.toml", env=env))
    assert published.returncode == 0, published.stderr
    with trio.fail_after(60):
        async with daemon_in(root, env) as daemon:
            await daemon.wait_log("ready")
            made = [line["path"] for line in daemon.lines
                    if line.get("event") == "created state directory"]
            assert made == [str(root / "state"), str(root / "state" / "run")]
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0, "\n".join(daemon.raw)
    assert mode(root / "var") == 0o755
    assert mode(root / "state") & 0o077 == 0 and mode(root / "state" / "run") & 0o077 == 0
    assert (root / "state" / "run" / "snapshot.json").is_file()


async def test_a_directory_that_cannot_be_made_is_refused_naming_key_and_path(
        tmp_path: Path) -> None:
    root = fresh_clone(tmp_path)
    (root / "var").write_text("a file where the directory should be\n")
    env = environment(free_port())
    want = f"$.control_plane.url: cannot create directory var (relative to {root}): " \
           f"{root / 'var'} is not a directory"
    checked = await trio.to_thread.run_sync(
        lambda: cli_in(root, "check", "--config", "conf/dev.toml", env=env))
    assert checked.returncode == 2
    assert want in checked.stderr
    with trio.fail_after(60):
        async with daemon_in(root, env) as daemon:
            assert await daemon.wait() == 2
    assert want in "\n".join(daemon.raw)


async def test_an_absolute_directory_is_left_to_the_deployment(tmp_path: Path) -> None:
    root = fresh_clone(tmp_path)
    missing = tmp_path / "not-mounted"
    env = {**environment(free_port()),
           "SUPERVISOR_CONTROL_PLANE__URL": f"sqlite:///{missing}/controlplane.db"}
    with trio.fail_after(60):
        async with daemon_in(root, env) as daemon:
            assert await daemon.wait() == 2
    assert f"directory {missing} (of sqlite:///{missing}/controlplane.db" in "\n".join(daemon.raw)
    assert not missing.exists()
    assert not (root / "var").exists()
