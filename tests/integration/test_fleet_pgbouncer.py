"""Everything works through a real PgBouncer in transaction pooling mode.

PgBouncer is Debian's package (``apt-get install pgbouncer``; .ci/run installs
it; without it these tests skip, naming it), in front of the run's server, started by a session-scoped fixture (:mod:`tests.pgfleet`) with one server
connection per pool, and terminated in its teardown. With a single server
session shared by every client, session state set by one client is visible to
the next and a statement prepared by one collides with another's: the store
must rely on none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import trio

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.factory import open_admin
from supervisor.controlplane.store import RevisionAdmin
from supervisor.revision.document import SCHEMA_VERSION
from tests.pgfleet import pgbouncer
from tests.pgserver import Server
from tests.postgres import sql_publish
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config

BODY = b'{"schema_version": 1, "aliases": {"a": {"upstream": "https://a.example/"}}}'


@pytest.fixture(scope="session")
def bouncer_port(pg_server: Server) -> Iterator[int]:
    with pgbouncer(pg_server) as port:
        yield port


def through(bouncer_port: int, pg_url: str) -> str:
    return f"postgresql://postgres@127.0.0.1:{bouncer_port}/{pg_url.rpartition('/')[2]}"


def server_statement_timeout(url: str) -> str:
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        row = conn.execute("SHOW statement_timeout").fetchone()
    assert row is not None
    return str(row[0])


async def test_two_stores_share_one_server_session_without_leaking_state(
    pg_url: str, bouncer_port: int
) -> None:
    url = through(bouncer_port, pg_url)
    stores: list[RevisionAdmin] = [
        open_admin(ControlPlaneConfig(url=url), max_schema_version=SCHEMA_VERSION)
        for _ in range(2)
    ]
    with trio.fail_after(60):
        try:
            await stores[0].migrate()
            rid = await stores[0].publish(BODY, 1, "through pgbouncer")
            # More calls than psycopg's prepare threshold (5), interleaved on one
            # server session: a server-side prepared statement would collide.
            for _ in range(8):
                for store in stores:
                    pointer = await store.observe()
                    assert pointer is not None and pointer.revision == rid
                    loaded = await store.hydrate()
                    assert loaded is not None and loaded.body == BODY
            # The per-call statement_timeout did not outlive its transaction.
            assert await trio.to_thread.run_sync(server_statement_timeout, url) == "0"
        finally:
            for store in stores:
                await store.aclose()


async def test_cli_and_a_replica_through_pgbouncer_converge_with_listen_on_a_direct_url(
    tmp_path: Path, pg_url: str, bouncer_port: int
) -> None:
    url = through(bouncer_port, pg_url)
    port = free_port()
    # An hour's poll: only the notification on the direct listen_url can converge it.
    config = write_config(tmp_path, url, port=port, poll_interval_s=3600,
                          extra="")
    text = config.read_text().replace(
        "[control_plane]\n", f'[control_plane]\nlisten_url = "{pg_url}"\n')
    config.write_text(text)
    await acli("check", "--config", str(config))
    await acli("db", "migrate", "--config", str(config))
    await acli("db", "migrate", "--config", str(config))  # twice: harmless
    first = await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    assert first.stdout.strip().splitlines()[-1] == "1"
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            await daemon.wait_log("listening for desired-state notifications")
            second = await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            assert second.stdout.strip().splitlines()[-1] == "2"
            await daemon.wait_log("published", revision=2)
            status = await acli("status", "--url", f"http://127.0.0.1:{port}", "--json")
            assert '"active": 2' in status.stdout.replace(" ", " ")
    assert await trio.to_thread.run_sync(server_statement_timeout, url) == "0"


async def test_replica_through_pgbouncer_polls_with_listen_off(
    tmp_path: Path, pg_url: str, bouncer_port: int
) -> None:
    url = through(bouncer_port, pg_url)
    port = free_port()
    config = write_config(tmp_path, url, port=port, poll_interval_s=0.5, listen=False)
    await acli("db", "migrate", "--config", str(config))
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            for _ in range(3):
                rid = await trio.to_thread.run_sync(sql_publish, pg_url)
                await daemon.wait_log("published", revision=rid)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                report = (await http.get("/status")).json()
            assert report["revision"]["active"] == rid
            assert report["revision"]["consecutive_failures"] == 0
            assert not [line for line in daemon.lines if line.get("level") == "error"]
