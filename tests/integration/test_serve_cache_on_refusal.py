"""``[cache].serve_when_desired_refused`` both ways, through the real process.

A revision whose ``env:`` secret the daemon cannot resolve is published (the CLI
does not resolve secrets) while a valid signed cache sits on disk. By default
the boot refuses (exit 3: a replica never serves a revision it was not asked to
serve); with the switch on, it serves the cache: ``source = last_known_good``,
the refusal in ``last_rejection``, the metric at 1 and an error line every poll
until desired compiles. The switch covers every refusal of the desired revision,
also those made before compiling (``corrupt``: a body that does not match its
digest; ``denied``: one above ``max_revision_bytes``).
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest
import trio

from tests.cacheprocess import cache_config, keys, serve_once_and_stop
from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, free_port, run_daemon


def document(path: Path, secret: str) -> Path:
    path.write_text(json.dumps({
        "schema_version": 1,
        "aliases": {"chat": {"upstream": "https://chat.example/v1"}},
        "keys": {"team": {"secret": secret, "aliases": ["chat"]}},
    }))
    return path


async def prepare(tmp_path: Path, port: int, *, switch: bool) -> Path:
    key, verify = keys(tmp_path)
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    config = cache_config(tmp_path, url, key, [verify], admin_port=port)
    if switch:
        config.write_text(config.read_text().replace(
            "[cache]\n", "[cache]\nserve_when_desired_refused = true\n"))
    await acli("publish", "--config", str(config),
               str(document(tmp_path / "good.json", "env:HOME")))
    await serve_once_and_stop(config)  # exports revision 1 to the cache
    await acli("publish", "--config", str(config),
               str(document(tmp_path / "bad.json", "env:TSUP_TEST_NEVER_SET")))
    return config


async def test_default_refuses_to_boot(tmp_path: Path) -> None:
    config = await prepare(tmp_path, free_port(), switch=False)
    result = await acli("run", "--config", str(config), check=False, timeout=30)
    assert result.returncode == 3, result.stderr
    assert "TSUP_TEST_NEVER_SET" in result.stderr


async def test_switch_serves_the_cache_and_says_so_once_then_its_end(tmp_path: Path) -> None:
    port = free_port()
    config = await prepare(tmp_path, port, switch=True)
    config.write_text(re.sub(r"poll_interval_s = [0-9.]+", "poll_interval_s = 0.2",
                             config.read_text()))
    base = f"http://127.0.0.1:{port}"
    with trio.fail_after(60):
        async with run_daemon(config) as daemon, httpx.AsyncClient(timeout=5) as http:
            await daemon.wait_log("desired revision refused at boot; serving the last-known-good "
                                  "cache ([cache].serve_when_desired_refused)", reason="secret")
            await daemon.wait_log("ready")
            report = (await http.get(f"{base}/status")).json()["revision"]
            assert report["source"] == "last_known_good" and report["active"] == 1
            assert report["desired"] == 2
            assert report["last_rejection"]["revision"] == 2
            assert report["last_rejection"]["reason"] == "secret"
            metrics = (await http.get(f"{base}/metrics")).text
            assert "supervisor_serving_last_known_good 1.0" in metrics
            # One warning line for the repeated refusal, not one per poll (0.2 s).
            def refusals() -> list[dict[str, object]]:
                return [x for x in daemon.lines if x.get("event")
                        == "revision refused; previous snapshot keeps serving"]

            async def five_failures() -> bool:
                doc = (await http.get(f"{base}/status")).json()["revision"]
                return int(doc["consecutive_failures"]) >= 5

            await poll_until(five_failures)
            [line] = refusals()
            assert line["level"] == "warning" and line["reason"] == "secret"
            # Desired compiles again: served from the control plane, the refusal's end logged.
            good = document(tmp_path / "good2.json", "env:HOME")
            await acli("publish", "--config", str(config), str(good))
            await daemon.wait_log("published", revision=3, source="control_plane")
            ended = await daemon.wait_log("revision refusal recovered")
            assert ended["level"] == "info" and ended["after_s"] >= 0.8
            # Five failures were seen: the boot's (told by its own line) and at least four
            # polls, which the streak counts.
            assert ended["attempts"] >= 4
            assert len(refusals()) == 1
            metrics = (await http.get(f"{base}/metrics")).text
            assert "supervisor_serving_last_known_good 0.0" in metrics


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
