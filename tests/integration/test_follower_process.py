"""Follower mode through real processes: an upstream, followers, and a follower of a follower.

The upstream reads PostgreSQL and serves its active revision, signed with its
cache key, on ``GET /v1/revision``. Followers poll it (every 0.3 s here),
verify against their ``[control_plane].trusted_keys``, compile, and serve it
themselves; they forward the upstream's signed bytes, unchanged, to whoever
follows them.

One scenario, in phases: a publish reaches all; the upstream is killed (the
followers keep serving, ready, reporting ``unavailable``) and a revision is
published while it is down; it returns signing with a new key that two
followers trust and one does not: those two (and the follower of a follower)
converge, the third refuses it as ``denied`` and keeps serving the old one.
"""

from __future__ import annotations

import signal
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path

import httpx
import msgspec
import trio
from trio_websocket import open_websocket_url

from tests.followers import POLL_S, Node, make_node, status_of, wait_active
from tests.httpproxy import answer, forward_get, read_head
from tests.polling import poll_until
from tests.proc import EXAMPLE, Daemon, NotifySocket, acli, free_port, run_daemon


async def test_a_fleet_of_followers_converges_survives_the_upstream_and_refuses_a_foreign_key(
    tmp_path: Path, pg_url: str
) -> None:
    upstream = make_node(tmp_path, "upstream", pg_url, [])
    new_upstream_key = make_node(tmp_path, "upstream-v2", pg_url, [upstream.verify_key],
                                 port=upstream.port, key_name="upstream2")
    trusting = [upstream.verify_key, new_upstream_key.verify_key]
    f1 = make_node(tmp_path, "f1", upstream.url, trusting)
    f2 = make_node(tmp_path, "f2", upstream.url, trusting)
    f3 = make_node(tmp_path, "f3", upstream.url, [upstream.verify_key])  # not the new key
    # The follower of a follower trusts the root's keys only, not f1's: f1 forwards
    # the upstream's signed bytes unchanged, so a hub cannot forge a revision.
    ff = make_node(tmp_path, "ff", f1.url, trusting)
    followers = [f1, f2, f3, ff]

    await acli("db", "migrate", "--config", str(upstream.config))
    await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            up: Daemon = await stack.enter_async_context(run_daemon(upstream.config))
            await up.wait_log("published", revision=1)
            # A cold follower with no cache refuses to boot while its upstream cannot
            # answer (exit 3, as on a database): the follower of a follower starts last.
            for tier in ([f1, f2, f3], [ff]):
                for node in tier:
                    await stack.enter_async_context(run_daemon(node.config))
                for node in tier:
                    await wait_active(node, 1)
            for node in followers:
                report = await status_of(node)
                want = f1.url if node is ff else upstream.url
                assert report["revision"]["source"] == want
                assert report["revision"]["upstream"] == want

            # A publish reaches all, the follower of a follower included.
            await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")
            for node in followers:
                await wait_active(node, 2)

            # The upstream killed: every follower keeps serving, and says why it cannot converge.
            up.signal(signal.SIGKILL)
            await up.wait()
            await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")  # 3, to PG

            async def failing(node: Node) -> bool:
                report = await status_of(node)
                return bool(report["revision"]["consecutive_failures"] >= 2
                            and report["revision"]["active"] == 2)

            for node in (f1, f2, f3):
                await poll_until(lambda node=node: failing(node))
                async with httpx.AsyncClient(base_url=node.url) as http:
                    assert (await http.get("/readyz")).status_code == 200
                    assert (await http.get("/v1/snapshot")).json()["revision"] == 2

            # It returns, signing with a key f3 does not trust.
            await stack.enter_async_context(run_daemon(new_upstream_key.config))
            for node in (f1, f2, ff):
                await wait_active(node, 3)

            async def refused() -> bool:
                report = (await status_of(f3))["revision"]
                rejection = report["last_rejection"] or {}
                return bool(rejection.get("reason") == "denied")

            await poll_until(refused)
            report = await status_of(f3)
            assert report["revision"]["active"] == 2
            async with httpx.AsyncClient(base_url=f3.url) as http:
                assert (await http.get("/readyz")).status_code == 200


async def test_the_upstream_stream_wakes_a_follower_and_polling_alone_converges(
    tmp_path: Path
) -> None:
    """An hour's poll converges only through the stream hint; with the hint off, the poll does."""
    upstream = make_node(tmp_path, "upstream", f"sqlite:///{tmp_path}/cp.db", [])
    hinted = make_node(tmp_path, "hinted", upstream.url, [upstream.verify_key])
    text = hinted.config.read_text().replace(f"poll_interval_s = {POLL_S}",
                                             "poll_interval_s = 3600")
    hinted.config.write_text(text)
    polling = make_node(tmp_path, "polling", upstream.url, [upstream.verify_key])
    text = polling.config.read_text().replace("[control_plane]\n",
                                              "[control_plane]\nlisten = false\n")
    polling.config.write_text(text)
    await acli("db", "migrate", "--config", str(upstream.config))
    await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with run_daemon(upstream.config) as up:
            await up.wait_log("published", revision=1)
            async with run_daemon(hinted.config) as hint, run_daemon(polling.config) as poll:
                await hint.wait_log("following the upstream's stream for wake-ups")
                await wait_active(polling, 1)
                await wait_active(hinted, 1)
                for revision in (2, 3):
                    await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")
                    await hint.wait_log("published", revision=revision)
                    await poll.wait_log("published", revision=revision)
                assert not [line for line in poll.lines
                            if "stream" in str(line.get("event"))]


async def test_status_the_stream_and_the_status_line_name_the_upstream_as_source_alike(
    tmp_path: Path
) -> None:
    upstream = make_node(tmp_path, "upstream", f"sqlite:///{tmp_path}/cp.db", [])
    follower = make_node(tmp_path, "follower", upstream.url, [upstream.verify_key])
    await acli("db", "migrate", "--config", str(upstream.config))
    await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    where = {"source": upstream.url, "upstream": upstream.url}
    with trio.fail_after(60):
        async with run_daemon(upstream.config) as up:
            await up.wait_log("published", revision=1)
            async with run_daemon(follower.config, env={"NOTIFY_SOCKET": str(notify.path)}):
                await wait_active(follower, 1)
                async with open_websocket_url(f"ws://127.0.0.1:{follower.port}/v1/stream"
                                              ) as ws:

                    async def next_of(kind: str, **fields: object) -> dict[str, object]:
                        while True:
                            doc = msgspec.json.decode(await ws.get_message())
                            if doc["type"] == kind and all(doc.get(k) == v
                                                           for k, v in fields.items()):
                                return dict(doc)

                    first = await next_of("status")
                    assert {k: first["revision"][k] for k in where} == where  # type: ignore[index]
                    await acli("publish", "--config", str(upstream.config), str(EXAMPLE),
                               "--force")
                    published = await next_of("published", revision=2)
                    assert published["source"] == upstream.url
                    await notify.wait_for(f"serving revision 2 (generation 2, {upstream.url})")
                    # The upstream stops: the follower's outage is a status event.
                    up.signal(signal.SIGTERM)
                    assert await up.wait() == 0
                    event = await next_of("status", control_plane_up=False)
                    revision = event["revision"]
                    assert isinstance(revision, dict)
                    assert {k: revision[k] for k in where} == where
                    report = (await status_of(follower))["revision"]
                    assert {k: report[k] for k in where} == where
    notify.close()


class TamperingProxy:
    """A plain HTTP proxy to the upstream that flips the last body byte while ``tamper`` is set."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.tamper = False
        self.tampered = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        head = await read_head(stream)
        if head is None:
            return
        response = await forward_get(self.upstream, *head)
        body = bytearray(response.content)
        if self.tamper and response.status_code == 200 and body:
            body[-1] ^= 0x01
            self.tampered += 1
        await answer(stream, response, bytes(body))


async def test_a_proxy_flipping_a_byte_is_refused_as_corrupt_and_the_follower_keeps_serving(
    tmp_path: Path
) -> None:
    upstream = make_node(tmp_path, "upstream", f"sqlite:///{tmp_path}/cp.db", [])
    proxy = TamperingProxy(upstream.url)
    proxy_port = free_port()
    follower = make_node(tmp_path, "follower", f"http://127.0.0.1:{proxy_port}",
                         [upstream.verify_key])
    text = follower.config.read_text().replace("[control_plane]\n",
                                               "[control_plane]\nlisten = false\n")
    follower.config.write_text(text)
    await acli("db", "migrate", "--config", str(upstream.config))
    await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, proxy.handle, proxy_port,
                                        host="127.0.0.1"))
            async with run_daemon(upstream.config) as up:
                await up.wait_log("published", revision=1)
                async with run_daemon(follower.config) as daemon:
                    await wait_active(follower, 1)
                    proxy.tamper = True
                    await acli("publish", "--config", str(upstream.config), str(EXAMPLE), "--force")
                    line = await daemon.wait_log("revision refused; previous snapshot keeps "
                                                 "serving", reason="corrupt")
                    assert line["revision"] == 2
                    report = await status_of(follower)
                    assert report["revision"]["active"] == 1
                    assert report["revision"]["last_rejection"]["reason"] == "corrupt"
                    proxy.tamper = False
                    await wait_active(follower, 2)
            nursery.cancel_scope.cancel()
    assert proxy.tampered >= 1
