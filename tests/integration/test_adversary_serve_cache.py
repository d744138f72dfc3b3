"""Adversary drill: ``[cache].serve_when_desired_refused`` and refusals that are not compile ones.

With the switch on, a boot whose desired revision is refused by the compiler
(``secret``, ``validation``) serves the signed cache. A desired revision refused
before compiling is not covered: a body that does not match its digest
(``corrupt``) or one above ``max_revision_bytes`` (``denied``) still ends the
boot with exit 3, cache or not. An operator who turned the switch on so that one
bad publish cannot keep a rebooting fleet down gets exactly that outage.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
from pathlib import Path

import pytest
import trio

from tests.integration.test_cache_process import cache_config, keys, serve_once_and_stop
from tests.proc import EXAMPLE, acli, free_port, run_daemon


@pytest.mark.parametrize("refusal", ["corrupt", "denied"])
async def test_switch_serves_the_cache_for_every_refusal_of_desired(
        tmp_path: Path, refusal: str) -> None:
    key, verify = keys(tmp_path)
    cp = tmp_path / "cp.db"
    config = cache_config(tmp_path, f"sqlite:///{cp}", key, [verify], admin_port=free_port())
    config.write_text(config.read_text().replace(
        "[cache]\n", "[cache]\nserve_when_desired_refused = true\n"))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    await serve_once_and_stop(config)  # the cache holds revision 1
    good = json.dumps({"schema_version": 1, "aliases": {
        "x": {"upstream": "https://x.example/v1"}}}).encode()
    with sqlite3.connect(cp) as conn:
        if refusal == "corrupt":  # one byte flipped after the digest was taken
            body, digest = good.replace(b"x.example", b"y.example"), good
        else:  # larger than the default max_revision_bytes (16 MiB)
            body = good[:-1] + b', "pad": "' + b"p" * (17 * 1024 * 1024) + b'"}'
            digest = body
        conn.execute("INSERT INTO supervisor_revisions (schema_version, body, body_sha256)"
                     " VALUES (1, ?, ?)", (body, hashlib.sha256(digest).digest()))
        conn.execute("UPDATE supervisor_desired SET revision_id = 2")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            with trio.move_on_after(20):
                await daemon.wait_log("ready")
            code = daemon.process.returncode
            refused = [line.get("detail") for line in daemon.lines
                       if line.get("event") == "refused to boot"]
            assert code is None and not refused, (
                f"serve_when_desired_refused = true and a valid cache of revision 1, yet "
                f"desired revision 2 refused as {refusal} ended the boot (exit {code}): "
                f"{refused}")
            await daemon.wait_log("serving the last-known-good cache", revision=1)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
