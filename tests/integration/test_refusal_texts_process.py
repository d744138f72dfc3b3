"""Refusal texts are bounded whatever a revision holds, through the real daemon.

A revision whose alias name is 15 MiB (published by plain SQL, past every client
check) is refused; its detail names it quoted and cut with its full length, and
reaches ``/status``, the log and the stream within 1 KiB, so ``/status`` stays under
64 KiB and the stream's first frame under the client's message limit (a follower's
hint stream would close 1009).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import psycopg
import trio

from supervisor.admin.client import replica_websocket
from tests.postgres import publish_sql
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config

NAME_BYTES = 15 * 1024 * 1024


def _huge_name() -> bytes:
    return json.dumps({"schema_version": 1, "aliases": {
        "a" * NAME_BYTES: {"upstream": "https://a.example/v1"}}}).encode()


async def test_a_15_mib_alias_name_leaves_status_the_log_and_the_stream_bounded(
    tmp_path: Path, pg_url: str
) -> None:
    port = free_port()
    config = write_config(tmp_path, pg_url, port=port, poll_interval_s=0.5, listen=False)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE))
    body = _huge_name()
    with trio.fail_after(120):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")

            def publish() -> int:
                with psycopg.connect(pg_url) as conn:
                    return publish_sql(conn, body)

            rid = await trio.to_thread.run_sync(publish)
            line = await daemon.wait_log("revision refused; previous snapshot keeps serving",
                                         revision=rid)
            async with httpx.AsyncClient(timeout=30.0) as client:
                status = await client.get(f"http://127.0.0.1:{port}/status")
            async with replica_websocket(f"ws://127.0.0.1:{port}/v1/stream", None, None,
                                         timeout_s=30.0) as ws:
                first = await ws.get_message()
    assert len(status.content) < 64 * 1024, len(status.content)
    revision = status.json()["revision"]
    detail = revision["last_rejection"]["detail"]
    # The name is quoted and cut where the refusal is built, its full length shown.
    assert len(detail.encode()) <= 1024 and f"… ({NAME_BYTES + 2} bytes)]" in detail, detail
    assert "not a valid alias name" in detail
    assert len(revision["last_error"].encode()) <= 1024 + 64
    assert len(json.dumps(line)) < 8 * 1024
    assert max(len(raw) for raw in daemon.raw) < 8 * 1024
    assert len(first) < 64 * 1024 and json.loads(first)["type"] == "status"


async def test_a_boot_refused_for_a_15_mib_alias_name_says_so_in_a_bounded_line(
    tmp_path: Path, pg_url: str
) -> None:
    config = write_config(tmp_path, pg_url, listen=False)
    await acli("db", "migrate", "--config", str(config))
    with psycopg.connect(pg_url) as conn:
        publish_sql(conn, _huge_name())
    with trio.fail_after(120):
        async with run_daemon(config) as daemon:
            assert await daemon.wait() == 3
    assert any("refusing to boot" in raw for raw in daemon.raw), daemon.raw[-3:]
    assert max(len(raw) for raw in daemon.raw) < 8 * 1024
