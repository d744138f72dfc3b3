"""SIGTERM in every phase of the daemon's life ends in exit 0 within the shutdown grace."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import psycopg
import pytest
import trio

from supervisor.revision.document import SCHEMA_VERSION
from supervisor.sinks.lkg import LastKnownGood
from tests.chaos.support import (
    chaos_config,
    daemon_backends,
    fake_apiserver_process,
    poll_until,
    publish_once,
    revision_body,
    stop_within_grace,
    stream_clients,
    tag_of,
    wait_backend_on_lock,
    wait_fields,
)
from tests.fakes.apiserver import FakeControl, write_kubeconfig
from tests.proc import NotifySocket, acli, cli, free_port, run_daemon

pytestmark = pytest.mark.chaos

GRACE_S = 5.0


async def test_sigterm_during_bootstrap_against_a_locked_database(
    tmp_path: Path, pg_url: str
) -> None:
    """The first read waits on a lock another session holds (a stuck migration, say).

    Must not be lost: the ability to stop. SIGTERM before the first snapshot ends
    the process with 0 within the grace, the blocked statement is cancelled on the
    server, and the lock holder is undisturbed.
    """
    config, _ = chaos_config(tmp_path, pg_url, grace_s=GRACE_S)
    await acli("db", "migrate", "--config", str(config))
    await trio.to_thread.run_sync(publish_once, pg_url, revision_body(5, "r1"))
    with psycopg.connect(pg_url) as holder:
        holder.execute("LOCK TABLE supervisor_desired IN ACCESS EXCLUSIVE MODE")
        notify = NotifySocket(tmp_path / "notify")
        await notify.bind()
        with trio.fail_after(30):
            async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
                await wait_backend_on_lock(pg_url)
                await stop_within_grace(daemon, GRACE_S)
            # The waiting statement was cancelled on the server, not left queued on the lock.
            await poll_until(lambda: _no_backend_waiting(pg_url), "the blocked query cancelled")
        assert not any("READY=1" in text for _, text in notify.messages)
        notify.close()
        # The holder's transaction is intact.
        assert holder.execute("SELECT count(*) FROM supervisor_desired").fetchone() == (1,)


async def test_sigterm_during_bootstrap_against_a_hung_server(tmp_path: Path) -> None:
    """The database host accepts the TCP connection and then never answers.

    Must not be lost: the ability to stop, although libpq is blocked in its
    connect (connect_timeout 5 s) in a worker thread.
    """
    accepted = trio.Event()
    held: list[trio.SocketStream] = []

    async def black_hole(stream: trio.SocketStream) -> None:
        held.append(stream)
        accepted.set()
        await trio.sleep_forever()

    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/nothing"
    config, _ = chaos_config(tmp_path, url, grace_s=GRACE_S)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
            nursery.start_soon(trio.serve_listeners, black_hole, listeners)
            async with run_daemon(config) as daemon:
                await accepted.wait()
                await stop_within_grace(daemon, GRACE_S)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("election", [False, True])
@pytest.mark.parametrize("failure", ["hang", "503"])
async def test_sigterm_while_fanout_waits_in_preflight(
    tmp_path: Path, pg_url: str, failure: str, election: bool
) -> None:
    """Kubernetes hangs every request, or answers 503 (preflight retry: 300 s).

    Must not be lost: readiness (READY=1 and /readyz never wait for Kubernetes)
    and the ability to stop while a watcher is dormant in its preflight, or
    (leader election on) while the replica waits for the Lease it cannot read.
    """
    async with fake_apiserver_process(tmp_path / "apiserver.log") as fake:
        control = FakeControl(fake.url)
        await control.inject("*", ".*", status=503, times=None, hang=failure == "hang")
        write_kubeconfig(fake, tmp_path / "kubeconfig")
        config, port = chaos_config(
            tmp_path, pg_url, grace_s=GRACE_S,
            extra=f'[kubernetes]\nenabled = true\nkubeconfig = "{tmp_path}/kubeconfig"\n'
                  "preflight_retry_s = 300\n"
                  f"leader_election = {'true' if election else 'false'}\n")
        await acli("db", "migrate", "--config", str(config))
        await trio.to_thread.run_sync(publish_once, pg_url, revision_body(5, "r1"))
        notify = NotifySocket(tmp_path / "notify")
        await notify.bind()
        with trio.fail_after(60):
            async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon, \
                    httpx.AsyncClient(timeout=5) as http:
                await notify.wait_for("READY=1")
                assert (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
                # Both watchers have sent their preflight list.
                await poll_until(lambda: _preflight_requests(control, 2), "preflight requests")
                if failure == "503" and not election:
                    await wait_fields(daemon, error_class="namespace_or_rbac_unready")
                elif failure == "503":
                    await daemon.wait_log("lease request failed")
                status = (await http.get(f"http://127.0.0.1:{port}/status")).json()
                assert {st["state"] for st in status["fanout"].values()} == {"preflight"}
                if election:
                    assert status["leadership"]["role"] == "standby"
                await stop_within_grace(daemon, GRACE_S)
        notify.close()


async def _no_backend_waiting(pg_url: str) -> bool:
    return not await trio.to_thread.run_sync(
        lambda: daemon_backends(pg_url, waiting_on_lock=True))


async def _preflight_requests(control: FakeControl, n: int) -> bool:
    requests = await control.requests()
    return len([r for r in requests if r["method"] == "GET"]) >= n


async def test_sigterm_during_hydration(tmp_path: Path, pg_url: str) -> None:
    """The hydrating read of a new revision is blocked (its table locked) when SIGTERM comes.

    Must not be lost: the active snapshot until the end (the refused-to-finish
    candidate never half-applies) and the ability to stop within the grace.
    """
    snapshot = tmp_path / "snapshot.json"
    config, port = chaos_config(tmp_path, pg_url, grace_s=GRACE_S, poll_interval_s=3600,
                                listen=False, extra=f'[snapshot]\npath = "{snapshot}"\n')
    await acli("db", "migrate", "--config", str(config))
    first = await trio.to_thread.run_sync(publish_once, pg_url, revision_body(20, "r1"))
    with trio.fail_after(60):
        async with run_daemon(config) as daemon, httpx.AsyncClient(timeout=5) as http:
            await daemon.wait_log("ready")
            await trio.to_thread.run_sync(publish_once, pg_url, revision_body(20_000, "r2"))
            with psycopg.connect(pg_url) as holder:
                holder.execute("LOCK TABLE supervisor_revisions IN ACCESS EXCLUSIVE MODE")
                daemon.signal(signal.SIGHUP)  # converge now: observe, hydrate
                await wait_backend_on_lock(pg_url)
                resp = await http.get(f"http://127.0.0.1:{port}/v1/snapshot")
                assert resp.status_code == 200 and resp.json()["revision"] == first
                await stop_within_grace(daemon, GRACE_S)
                await poll_until(lambda: _no_backend_waiting(pg_url),
                                 "the blocked hydration cancelled")
    assert json.loads(snapshot.read_bytes())["revision"] == first


async def test_sigterm_just_after_publish(tmp_path: Path, pg_url: str) -> None:
    """SIGTERM the moment a new revision is published, while its snapshot file and
    signed cache are still being written.

    Must not be lost: the integrity of both files. After exit 0 within the grace,
    the snapshot file parses and is one of the two revisions, and the cache
    loads, with its signature verified, as one of them.
    """
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.strip().splitlines()[-1].split()[-1]
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    snapshot = tmp_path / "snapshot.json"
    config, _ = chaos_config(
        tmp_path, pg_url, grace_s=GRACE_S, poll_interval_s=3600,
        extra=(f'[snapshot]\npath = "{snapshot}"\n'
               f'[cache]\npath = "{cache_dir}/lkg.bin"\nsigning_key = "{key}"\n'
               f"trusted_keys = {json.dumps([verify])}\n"))
    await acli("db", "migrate", "--config", str(config))
    first = await trio.to_thread.run_sync(publish_once, pg_url, revision_body(20, "r1"))
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            second = await trio.to_thread.run_sync(publish_once, pg_url,
                                                   revision_body(20_000, "r2"))
            await daemon.wait_log("published", revision=second)
            await stop_within_grace(daemon, GRACE_S)
    on_disk = json.loads(snapshot.read_bytes())
    assert on_disk["revision"] in (first, second)
    assert tag_of(on_disk) == {"r1" if on_disk["revision"] == first else "r2"}
    cache = LastKnownGood(str(cache_dir / "lkg.bin"), signing_key_path=str(key),
                          trusted_keys=[verify], max_schema_version=SCHEMA_VERSION)
    loaded = cache.load()
    assert loaded is not None and loaded.revision in (first, second)
    assert tag_of({"aliases": json.loads(loaded.body)["aliases"]}) == {
        "r1" if loaded.revision == first else "r2"}
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".tmp")], "temp file left"


async def test_sigterm_with_ten_stream_clients(tmp_path: Path, pg_url: str) -> None:
    """Ten WebSocket clients follow /v1/stream when SIGTERM comes.

    Must not be lost: the clients' knowledge of why the stream ended: each gets
    a close frame 1001 "going away" (not a reset), and the process exits 0
    within the grace.
    """
    config, port = chaos_config(tmp_path, pg_url, grace_s=GRACE_S)
    await acli("db", "migrate", "--config", str(config))
    await trio.to_thread.run_sync(publish_once, pg_url, revision_body(5, "r1"))
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            async with stream_clients(port, 10) as clients:
                second = await trio.to_thread.run_sync(publish_once, pg_url,
                                                       revision_body(5, "r2"))
                for client in clients:
                    await client.wait_published(second)
                await stop_within_grace(daemon, GRACE_S)
                for client in clients:
                    await client.closed.wait()
    assert [client.close_code for client in clients] == [1001] * 10

