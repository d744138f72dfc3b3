"""``check`` refuses what the daemon cannot run with, naming the place, through the real process.

``[control_plane].max_revision_bytes`` has a minimum (1024); a value SQLite
cannot bind as a parameter (10**20) must not pass ``check`` only to crash the
convergence child at every hydrate: ``check`` and the boot agree (exit 2 naming
``$.control_plane.max_revision_bytes``, or a daemon that runs). A snapshot path
on the control-plane file is refused.
"""

from __future__ import annotations

from pathlib import Path

import trio

from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config

HUGE = 10**20


async def test_max_revision_bytes_check_and_run_agree(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'cp.db'}", port=free_port())
    await acli("publish", "--config", str(config), str(EXAMPLE))
    env = {"SUPERVISOR_CONTROL_PLANE__MAX_REVISION_BYTES": str(HUGE)}
    checked = await acli("check", "--config", str(config), env=env, check=False)
    if checked.returncode == 2:
        assert "max_revision_bytes" in checked.stderr, checked.stderr
        return
    assert checked.returncode == 0, checked.stderr
    with trio.fail_after(60):
        async with run_daemon(config, env=env) as daemon:
            with trio.move_on_after(20):
                await daemon.wait_log(None, level="critical")
            crashes = [line.get("error") for line in daemon.lines
                       if line.get("event") == "child crashed"]
            assert not crashes, (
                f"`check` accepted max_revision_bytes = {HUGE}, but the daemon crash-loops "
                f"on it ({len(crashes)} crashes: {crashes[0]}); exit "
                f"{daemon.process.returncode}")
            await daemon.wait_log("ready")


async def test_snapshot_path_on_the_control_plane_file_is_refused(tmp_path: Path) -> None:
    """``[snapshot].path`` naming the SQLite control-plane file (a typo; `check` says OK).

    Accepted, the first publish would replace cp.db with the snapshot JSON and
    every revision would be gone; the same for ``[cache].path`` on cp.db, and
    ``[snapshot].path`` on the cache file would destroy the cache. Refused: exit 2
    naming the two keys, before anything is written.
    """
    import sqlite3

    cp = tmp_path / "cp.db"
    config = write_config(tmp_path, f"sqlite:///{cp}", port=free_port(),
                          extra=f'[snapshot]\npath = "{cp}"\n')
    doc = tmp_path / "doc.json"
    doc.write_text('{"schema_version": 1, "aliases": {"x": {"upstream": "https://x.example/v1"}}}')
    published = await acli("publish", "--config", str(config), str(doc), check=False)
    if published.returncode == 2:  # refused before anything is written: the fix
        assert "snapshot.path" in published.stderr, published.stderr
        assert not cp.exists()
    else:
        assert published.returncode == 0, published.stderr
    checked = await acli("check", "--config", str(config), check=False)
    if checked.returncode == 2:
        assert "snapshot.path" in checked.stderr, checked.stderr
        return
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            with trio.move_on_after(5):
                await daemon.wait_log("control-plane file replaced or removed; reopening")
    try:
        with sqlite3.connect(cp) as conn:
            count = conn.execute("SELECT count(*) FROM supervisor_revisions").fetchone()
    except sqlite3.DatabaseError as exc:
        raise AssertionError(
            f"`check` accepted [snapshot].path = the control-plane file, and the daemon "
            f"overwrote the control plane with its snapshot: {exc}; cp.db now starts with "
            f"{cp.read_bytes()[:40]!r}") from exc
    assert count == (1,)


async def test_a_hook_command_that_is_no_executable_is_refused_by_check(tmp_path: Path) -> None:
    script = tmp_path / "hook.sh"
    script.write_text("#!/bin/sh\nexit 0\n")  # not executable yet
    for command, named in [(str(tmp_path / "missing"), "missing"), (str(script), "hook.sh"),
                           ("no-such-program-anywhere", "no-such-program-anywhere")]:
        config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                              extra=f'[hook]\ncommand = ["{command}", "--flag"]\n')
        checked = await acli("check", "--config", str(config), check=False)
        assert checked.returncode == 2, checked.stderr
        assert "$.hook.command" in checked.stderr and named in checked.stderr, checked.stderr
    script.chmod(0o755)
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                          extra=f'[hook]\ncommand = ["{script}"]\n')
    checked = await acli("check", "--config", str(config), check=False)
    assert "$.hook.command" not in checked.stderr, checked.stderr
