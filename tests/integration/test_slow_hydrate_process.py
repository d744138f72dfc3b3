"""A large revision over a slow link: the hydrate's deadline grows with the body (real process).

Through a rate-limited proxy, a 2.7 MiB body at 512 KiB/s takes 5.4 s, longer than
``read_timeout_s`` (2 s) but within its hydrate deadline (2 s plus 1 s per 256
KiB: 12.7 s): it is served. Slower than ``min_read_rate_kib_s``, the read times out as
``unavailable`` naming the bytes read and the time, while ``control_plane_up``
stays true (the observe was answered) and no outage is logged. A read that
takes longer than the poll and backoff alone but stays within the store's own
deadlines is no stall: ``/healthz`` stays 200 throughout.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import trio

from tests.health import sample_health_blocking, status
from tests.polling import poll_until
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config
from tests.tcpproxy import pg_proxy, proxied_url

REFUSED = "revision refused; previous snapshot keeps serving"


def _body(path: Path, target_bytes: int) -> Path:
    lines = ["schema_version = 1"]
    size = 0
    i = 0
    while size < target_bytes:
        alias = f'[aliases.a{i:06d}]\nupstream = "https://a{i:06d}.internal.example/v1"\n'
        lines.append(alias)
        size += len(alias)
        i += 1
    path.write_text("\n".join(lines))
    return path



async def _behind_a_proxy(tmp_path: Path, pg_url: str) -> tuple[Path, Path, Path, int, int]:
    """Revision 1 published; a daemon reading PostgreSQL through a proxy the test slows
    (read_timeout_s 2 s, 256 KiB/s); a 2 MiB revision to publish.
    (direct configuration, the daemon's, the big revision, proxy port, admin port)."""
    direct = write_config(tmp_path, pg_url)
    await acli("db", "migrate", "--config", str(direct))
    await acli("publish", "--config", str(direct), str(EXAMPLE))
    big = _body(tmp_path / "big.toml", 2 * 1024 * 1024)
    proxy_port, admin_port = free_port(), free_port()
    daemon_dir = tmp_path / "daemon"
    daemon_dir.mkdir()
    config = write_config(
        daemon_dir, proxied_url(pg_url, proxy_port), port=admin_port, poll_interval_s=0.5,
        listen=False, backoff_initial_s=0.1, backoff_max_s=0.5,
        control_plane_extra="read_timeout_s = 2.0\nmin_read_rate_kib_s = 256")
    return direct, config, big, proxy_port, admin_port


async def test_a_large_body_over_a_slow_link_is_served_within_its_grown_deadline(
    tmp_path: Path, pg_url: str
) -> None:
    direct, config, big, proxy_port, admin_port = await _behind_a_proxy(tmp_path, pg_url)
    with trio.fail_after(120):
        async with pg_proxy(proxy_port, pg_url) as proxy, run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            proxy.rate_bps = 64 * 1024  # 43 s for the body: past its 12.7 s deadline
            await acli("publish", "--config", str(direct), str(big))
            line = await daemon.wait_log(REFUSED, reason="unavailable")
            assert "timed out after" in line["detail"] and "bytes read" in line["detail"]
            assert line["revision"] == 2
            doc = await status(admin_port)
            assert doc["revision"]["control_plane_up"] is True
            assert doc["revision"]["active"] == 1
            proxy.rate_bps = 512 * 1024  # 5.4 s: over read_timeout_s, within the deadline
            await daemon.wait_log("published", revision=2)
    assert not [entry for entry in daemon.lines
                if str(entry.get("event", "")).startswith("control plane unreachable")]


async def test_a_slow_but_progressing_hydrate_is_not_called_stalled(
    tmp_path: Path, pg_url: str
) -> None:
    # 3 * poll_interval_s + backoff_max_s is 2 s here; the hydrate takes 5.4 s, within
    # its own deadline: the stall limit counts the store's deadlines of an attempt.
    direct, config, big, proxy_port, admin_port = await _behind_a_proxy(tmp_path, pg_url)
    seen: list[tuple[int, dict[str, Any]] | None] = []
    stop = threading.Event()
    with trio.fail_after(120):
        async with pg_proxy(proxy_port, pg_url) as proxy, run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, sample_health_blocking,
                                   admin_port, seen, stop)
                try:
                    await poll_until(lambda: len(seen) >= 1)
                    proxy.rate_bps = 512 * 1024
                    await acli("publish", "--config", str(direct), str(big))
                    await daemon.wait_log("published", revision=2)
                finally:
                    stop.set()
    answers = [sample for sample in seen if sample is not None]
    assert len(answers) >= 10  # sampled all along the slow read
    assert [answer for answer in answers if answer[0] != 200] == []
