"""PostgreSQL goes away mid-run: through a TCP proxy we cut, and by a real server restart."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio

from tests.chaos.support import (
    StreamClient,
    chaos_config,
    get_json,
    metric,
    publish_once,
    revision_body,
    snapshot_file_at,
    stop_within_grace,
    stream_clients,
    tag_of,
)
from tests.pgserver import Server
from tests.polling import poll_until
from tests.proc import Daemon, NotifySocket, acli, free_port, run_daemon
from tests.tcpproxy import TcpProxy, pg_proxy
from tests.tcpproxy import proxied_url as proxied

# The readers below sample the daemon's output continuously during the fault;
# this is their sampling cadence, not a wait for something to happen.
SAMPLE_EVERY_S = 0.01

pytestmark = pytest.mark.chaos


async def test_outage_through_the_proxy_keeps_serving_and_converges_after(
    tmp_path: Path, pg_url: str
) -> None:
    """The database host disappears (every connection cut, new ones refused) and comes back.

    Must not be lost: the active snapshot (GET /v1/snapshot stays 200 with the same
    ETag and body, /readyz stays 200, the snapshot file keeps its content) for the
    whole outage; the revision published during the outage, which the daemon
    cannot see until the database returns, is converged to afterwards. While
    down, the replica reports it: lag grows, failures count, control_plane_up is 0
    and each failed attempt is counted as ``unavailable``.
    """
    proxy_port = free_port()
    snapshot = tmp_path / "snapshot.json"
    config, port = chaos_config(tmp_path, proxied(pg_url, proxy_port), poll_interval_s=0.2,
                                extra=f'[snapshot]\npath = "{snapshot}"\n')
    base = f"http://127.0.0.1:{port}"
    async with pg_proxy(proxy_port, pg_url) as proxy:
        await acli("db", "migrate", "--config", str(config))
        first = await trio.to_thread.run_sync(publish_once, pg_url, revision_body(50, "r1"))
        notify = NotifySocket(tmp_path / "notify")
        await notify.bind()
        with trio.fail_after(90):
            async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon, \
                    httpx.AsyncClient(timeout=5) as http:
                await notify.wait_for("READY=1")
                async with stream_clients(port, 1) as (watcher,):
                    await _outage_drill(daemon, http, watcher, proxy, pg_url, base, first,
                                        snapshot)
        notify.close()


async def _outage_drill(daemon: Daemon, http: httpx.AsyncClient, watcher: StreamClient,
                        proxy: TcpProxy, pg_url: str, base: str, first: int,
                        snapshot: Path) -> None:
    code, before, etag = await get_json(http, f"{base}/v1/snapshot")
    assert code == 200 and before["revision"] == first
    assert etag == f'"{first}-1"'

    proxy.stop()
    await daemon.wait_log("control plane unreachable", reason="unavailable")
    # Published where the daemon cannot see it.
    second = await trio.to_thread.run_sync(publish_once, pg_url, revision_body(50, "r2"))

    # Failed attempts are counted in the metric (the log says "unreachable" once).
    async def unavailable() -> float:
        text = (await http.get(f"{base}/metrics")).text
        return metric(text, "supervisor_revision_rejections_total", reason="unavailable")

    # Several failed attempts later (backoff at most 0.5 s) it still serves.
    failed = int(await unavailable())
    for n in range(failed + 1, failed + 4):
        code, body, now_etag = await get_json(http, f"{base}/v1/snapshot")
        assert (code, now_etag) == (200, etag)
        assert body == before
        assert (await http.get(f"{base}/readyz")).status_code == 200
        assert json.loads(snapshot.read_bytes()) == before

        async def reached(n: int = n) -> bool:
            return await unavailable() >= n

        await poll_until(reached)
    status = (await http.get(f"{base}/status")).json()["revision"]
    assert status["active"] == first and status["source"] == "control_plane"
    assert status["lag_s"] > 0 and status["consecutive_failures"] >= 3
    metrics = (await http.get(f"{base}/metrics")).text
    assert metric(metrics, "supervisor_control_plane_up") == 0
    assert metric(metrics, "supervisor_revision_rejections_total", reason="unavailable") >= 3
    # The stream said so too.
    assert any(m.get("type") == "status" and m.get("control_plane_up") is False
               for m in watcher.messages)

    await proxy.start()
    await daemon.wait_log("published", revision=second)
    await watcher.wait_published(second)
    code, after, etag = await get_json(http, f"{base}/v1/snapshot")
    assert code == 200 and after["revision"] == second and tag_of(after) == {"r2"}
    assert etag == f'"{second}-2"'
    assert await snapshot_file_at(snapshot, second) == after
    status = (await http.get(f"{base}/status")).json()["revision"]
    assert status["active"] == second and status["lag_s"] == 0
    assert status["consecutive_failures"] == 0
    await stop_within_grace(daemon, 5.0)


async def test_outage_is_visible_as_unavailable_in_status(tmp_path: Path, pg_url: str) -> None:
    """While the control plane is unreachable, /status itself says so.

    Must not be lost: the *reason* the replica is lagging. An operator reading
    ``trio-supervisor status`` during an outage must see that the control plane is
    unavailable, not only a growing ``lag_s`` and a failure count.
    """
    proxy_port = free_port()
    config, port = chaos_config(tmp_path, proxied(pg_url, proxy_port), poll_interval_s=0.2)
    async with pg_proxy(proxy_port, pg_url) as proxy:
        await acli("db", "migrate", "--config", str(config))
        await trio.to_thread.run_sync(publish_once, pg_url, revision_body(5, "r1"))
        with trio.fail_after(60):
            async with run_daemon(config) as daemon, httpx.AsyncClient(timeout=5) as http:
                await daemon.wait_log("ready")
                proxy.stop()
                await daemon.wait_log("control plane unreachable", reason="unavailable")
                status = (await http.get(f"http://127.0.0.1:{port}/status")).json()
                await stop_within_grace(daemon, 5.0)
    assert status["revision"]["control_plane_up"] is False, status
    assert status["revision"]["last_error"].startswith("unavailable"), status


async def test_real_postgresql_restart(tmp_path: Path, pg_url: str, pg_server: Server) -> None:
    """A real restart of the run's server (``pg_ctl restart`` of the suite's own, or
    ``pg_ctlcluster restart`` of a Debian cluster): every backend is terminated, the server
    is gone, then back.

    Must not be lost: the active snapshot keeps serving (same ETag) throughout,
    the LISTEN child reconnects, and a revision published right after the
    restart is converged with the poll interval at an hour, so only the
    reconnect wake-up, a notification or the failure backoff can have done it.
    """
    pg_server.require_restart()
    config, port = chaos_config(tmp_path, pg_url, poll_interval_s=3600)
    base = f"http://127.0.0.1:{port}"
    await acli("db", "migrate", "--config", str(config))
    first = await trio.to_thread.run_sync(publish_once, pg_url, revision_body(20, "r1"))
    try:
        with trio.fail_after(120):
            async with run_daemon(config) as daemon, httpx.AsyncClient(timeout=5) as http:
                await daemon.wait_log("ready")
                await daemon.wait_log("listening for desired-state notifications")
                _, _, etag = await get_json(http, f"{base}/v1/snapshot")
                restarted = trio.Event()
                served = 0

                async def keep_reading() -> None:
                    nonlocal served
                    while not restarted.is_set():
                        code, body, now = await get_json(http, f"{base}/v1/snapshot")
                        assert (code, now, body["revision"]) == (200, etag, first)
                        served += 1
                        await trio.sleep(SAMPLE_EVERY_S)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(keep_reading)
                    await trio.to_thread.run_sync(pg_server.restart)
                    restarted.set()
                assert served > 0
                second = await trio.to_thread.run_sync(publish_once, pg_url,
                                                       revision_body(20, "r2"))
                await daemon.wait_log("published", revision=second)
                code, body, etag = await get_json(http, f"{base}/v1/snapshot")
                assert code == 200 and tag_of(body) == {"r2"}
                await stop_within_grace(daemon, 5.0)
        assert any(line.get("event") == "LISTEN connection unreachable"
                   for line in daemon.lines)
    finally:
        await trio.to_thread.run_sync(pg_server.ensure_up)
