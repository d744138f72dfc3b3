"""The PostgreSQL database dropped and re-created under the same name is a new epoch.

What a restore by ``dropdb && createdb && pg_restore`` (or a re-provisioned
database) looks like to a running replica: same DSN, another database (a new
oid), revision ids starting again from 1 with other bodies. The replica
notices the new epoch, publishes the new desired revision (lower id, other
content), reports it truthfully, and leaves a cache a cold boot serves.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from tests.pgserver import Server
from tests.postgres import body, publish_sql
from tests.proc import acli, cli, free_port, run_daemon, write_config
from tests.tcpproxy import pg_proxy, proxied_url


async def get(port: int, path: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5.0) as client:
        return dict((await client.get(f"http://127.0.0.1:{port}{path}")).json())


async def test_database_dropped_and_recreated_is_a_new_epoch(tmp_path: Path, pg_url: str,
                                                            pg_server: Server) -> None:
    name = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    cache = tmp_path / "cache" / "lkg.bin"
    port = free_port()
    config = write_config(
        tmp_path, pg_url, port=port, poll_interval_s=0.2, listen=True,
        backoff_initial_s=0.1, backoff_max_s=0.5,
        extra=f'[cache]\npath = "{cache}"\nsigning_key = "{key}"\n'
              f'trusted_keys = ["{verify}"]\n')
    await acli("db", "migrate", "--config", str(config))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for _ in range(3):
            publish_sql(conn, body("old0", "old1"))
    with trio.fail_after(90):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=3)
            with pg_server.admin() as conn:
                conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{name}"')
            await acli("db", "migrate", "--config", str(config))
            with psycopg.connect(pg_url, autocommit=True) as conn:
                assert publish_sql(conn, body("new")) == 1
            await daemon.wait_log("control plane identity changed (a restore, or another "
                                  "database): new epoch; re-reading the desired revision and "
                                  "re-writing the sinks, and the cache's rollback mark follows "
                                  "what this epoch serves")
            await daemon.wait_log("published", revision=1)
            assert sorted((await get(port, "/v1/snapshot"))["aliases"]) == ["new"]
            report = (await get(port, "/status"))["revision"]
            assert report["desired"] == report["active"] == 1 and report["lag_s"] == 0.0
            # The LISTEN child is back on the new database: a publish wakes the loop.
            await daemon.wait_log("listening for desired-state notifications")
            with psycopg.connect(pg_url, autocommit=True) as conn:
                assert publish_sql(conn, body("newer")) == 2
            await daemon.wait_log("published", revision=2)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    # A cold boot with the database unreachable serves what was served last.
    async with pg_proxy(free_port(), pg_url, up=False) as proxy:
        down = write_config(
            tmp_path, proxied_url(pg_url, proxy.port), port=free_port(), listen=False,
            extra=f'[cache]\npath = "{cache}"\nsigning_key = "{key}"\n'
                  f'trusted_keys = ["{verify}"]\n')
        with trio.fail_after(60):
            async with run_daemon(down) as booted:
                line = await booted.wait_log("serving the last-known-good cache")
                assert line["revision"] == 2
                booted.signal(signal.SIGTERM)
                assert await booted.wait() == 0
