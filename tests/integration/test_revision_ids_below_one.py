"""Revision ids the schema allows but the cache does not (id 0, negative) never crash convergence.

Anyone may publish with plain SQL (docs/control-plane.md); nothing in either
schema keeps an id >= 1 (SQLite's INTEGER PRIMARY KEY takes 0 or -5;
PostgreSQL's identity column takes an explicit id with OVERRIDING SYSTEM VALUE,
and a restore script can restart the sequence at 0 with MINVALUE 0). Such a
revision compiles, but the cache cannot hold it: the convergence child must not
crash on the export (a crash loop would end the process with exit 4, and every
restart would crash in the bootstrap the same way), through the real process.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
import trio

from tests.proc import EXAMPLE, acli, cli, free_port, run_daemon, write_config


def _config(tmp_path: Path) -> tuple[Path, Path]:
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    cp = tmp_path / "cp.db"
    config = write_config(
        tmp_path, f"sqlite:///{cp}", port=free_port(), poll_interval_s=0.2,
        extra=f'[cache]\npath = "{tmp_path / "cache" / "lkg.bin"}"\n'
              f'signing_key = "{key}"\ntrusted_keys = ["{verify}"]\n')
    return config, cp


def _insert(cp: Path, revision: int, tag: str) -> None:
    data = json.dumps({"schema_version": 1, "aliases": {
        tag: {"upstream": f"https://{tag}.example/v1"}}}).encode()
    with sqlite3.connect(cp) as conn:
        conn.execute(
            "INSERT INTO supervisor_revisions (id, schema_version, body, body_sha256)"
            " VALUES (?, 1, ?, ?)", (revision, data, hashlib.sha256(data).digest()))
        conn.execute("UPDATE supervisor_desired SET revision_id = ?", (revision,))


@pytest.mark.chaos  # 2 x 12 s through the real process: run by CI's `pytest -m chaos`
@pytest.mark.parametrize("revision", [0, -3])
async def test_a_revision_id_below_one_never_crashes_convergence(
        tmp_path: Path, revision: int) -> None:
    config, cp = _config(tmp_path)
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            _insert(cp, revision, "zero")
            # Either it is refused/served, or the child crashes: whichever comes first.
            with trio.move_on_after(10):
                while True:
                    crashed = [line for line in daemon.lines
                               if line.get("event") in ("child crashed",
                                                        "restart intensity exceeded; giving up")]
                    assert not crashed, (
                        f"a revision with id {revision} crashed the convergence child: "
                        f"{crashed[0].get('error')}")
                    if any(line.get("event") in ("published",
                                                 "revision refused; previous snapshot keeps "
                                                 "serving") and line.get("revision") == revision
                           for line in daemon.lines):
                        break
                    await daemon._new_line.wait()
            # And the loop still works: a good publish converges.
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            await daemon.wait_log("published", revision=2)
