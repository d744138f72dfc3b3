"""A hostile follower cannot steer the fleet walk nor grow its upstream's table.

It names itself (and a thousand made-up followers) to a real root, serves the root's
genuine statement (which anyone with the read token can copy), and lists the root
and itself (a cycle) beside thousands of made-up followers: the walk lists each
cycle once without walking it again, walks at most 64 of the others, and says what it
left out; past 1 MiB its list is refused and nothing below it walked. The root lists
at most 256 followers however many names it was given.
"""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from supervisor.admin.fleet import MAX_FOLLOWERS
from supervisor.commands.fleet import MAX_WIDTH
from supervisor.controlplane.replica_name import HEADERS
from supervisor.sinks.lkg.fileformat import MAGIC, encode_header
from supervisor.sinks.lkg.keys import KEY_ID_HEX_DIGITS
from supervisor.sinks.lkg.statement import Statement
from tests.followers import capture, make_node
from tests.httpproxy import read_head
from tests.proc import EXAMPLE, acli, free_port, run_daemon


def row(url: str) -> dict[str, Any]:
    return {"url": url, "sequence": 1, "etag": '"1.a.1"', "state": "converged",
            "reason": None, "last_seen": "2026-01-01T00:00:00Z"}


async def serve_hostile(answers: dict[str, bytes], stream: trio.SocketStream) -> None:
    head = await read_head(stream)
    if head is not None:
        body = answers.get(head[0].split(" ")[1], b"")
        code = "200 OK" if body else "404 Not Found"
        try:
            await stream.send_all(f"HTTP/1.1 {code}\r\ncontent-length: {len(body)}\r\n"
                                  f"connection: close\r\n\r\n".encode() + body)
        except trio.BrokenResourceError:
            pass  # the walk stopped reading at its bound
    await stream.aclose()


async def test_a_hostile_follower_advertising_a_cycle_and_a_huge_list(tmp_path: Path) -> None:
    root = make_node(tmp_path, "root", f"sqlite:///{tmp_path}/cp.db", [])
    await acli("db", "migrate", "--config", str(root.config))
    await acli("publish", "--config", str(root.config), str(EXAMPLE))
    port = free_port()
    hostile = f"http://127.0.0.1:{port}"
    # Nothing listens on port 9 (discard): each made-up follower is refused at once.
    made_up = [row(f"http://127.0.0.1:9/f{i}") for i in range(5000)]
    listing = {"followers": [row(root.url), row(hostile), *made_up]}
    with trio.fail_after(180):
        async with run_daemon(root.config), trio.open_nursery() as nursery:
            answers = {
                "/status": json.dumps({"revision": {
                    "active": 1, "desired": 1, "sequence": 1, "consecutive_failures": 0,
                    "control_plane_up": True, "lag_s": 0.0}}).encode(),
                "/v1/revision": await capture(root, 1),
                "/v1/followers": json.dumps(listing).encode()}
            assert len(answers["/v1/followers"]) < 1024 * 1024
            await nursery.start(partial(trio.serve_tcp, partial(serve_hostile, answers), port,
                                        host="127.0.0.1"))
            async with httpx.AsyncClient(base_url=root.url) as http:
                for url in [hostile] + [f"http://127.0.0.1:9/m{i}" for i in range(1000)]:
                    await http.get("/v1/revision", headers={
                        HEADERS["url"]: url, HEADERS["state"]: "converged",
                        HEADERS["poll_interval_s"]: "1e9"})
                await http.get("/v1/revision", headers={HEADERS["url"]: hostile})
                listed = (await http.get("/v1/followers")).json()["followers"]
            assert len(listed) == MAX_FOLLOWERS
            assert hostile in {r["url"] for r in listed}

            walked = await acli("status", "--fleet", "--json", "--url", root.url,
                                "--config", str(root.config), check=False)
            rows = json.loads(walked.stdout)["replicas"]
            assert walked.returncode == 1  # the made-up followers are unreachable
            # The root's own list is walked 64 wide: the hostile one sorts first.
            assert rows[0]["url"] == root.url and rows[1]["url"] == hostile
            assert rows[1]["state"] == "converged", rows[1]
            assert "more followers listed, not walked" in rows[1]["detail"]
            assert len([r for r in rows if r["depth"] == 1]) == MAX_WIDTH
            cycles = [r["url"] for r in rows if r["state"] == "cycle"]
            assert sorted(cycles) == sorted([root.url, hostile])
            below = [r for r in rows if r["depth"] == 2 and r["state"] != "cycle"]
            assert len(below) == MAX_WIDTH - 2
            assert {r["state"] for r in below} == {"unreachable"}
            assert max(r["depth"] for r in rows) == 2

            # Past 1 MiB: refused, nothing below it walked.
            listing["followers"] = [row(f"http://127.0.0.1:9/{'x' * 200}{i}")
                                    for i in range(5000)]
            answers["/v1/followers"] = json.dumps(listing).encode()
            walked = await acli("status", "--fleet", "--json", "--url", root.url, check=False)
            rows = json.loads(walked.stdout)["replicas"]
            assert (rows[1]["url"], rows[1]["state"]) == (hostile, "unverified"), rows[1]["detail"]
            assert "over 1048576 bytes" in rows[1]["detail"]
            assert max(r["depth"] for r in rows) == 1

            # A statement that is not the root's: listed, not walked.
            answers["/v1/revision"] = answers["/v1/revision"][:40] + b"\0" * 100
            answers["/v1/followers"] = json.dumps({"followers": made_up[:3]}).encode()
            walked = await acli("status", "--fleet", "--json", "--url", root.url, check=False)
            rows = json.loads(walked.stdout)["replicas"]
            assert (rows[1]["url"], rows[1]["state"]) == (hostile, "unverified"), rows[1]["detail"]
            assert max(r["depth"] for r in rows) == 1
            nursery.cancel_scope.cancel()


async def test_a_replica_saying_a_hostile_reason_is_listed_with_a_bounded_one(
        tmp_path: Path) -> None:
    # JSON may escape a lone surrogate, which no UTF-8 output can carry, and a reason
    # may be of any length: the row keeps neither, and the walk still prints. A lag of
    # NaN (which Python's JSON reads) is no lag: the answer stays valid JSON.
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    statement = Statement(1, "0" * 64, 1, "root-a", moment, moment + timedelta(days=3650))
    header = encode_header(revision=1, generation=1, schema_version=1, created_at=moment,
                           body=b"{}", key_id="0" * KEY_ID_HEX_DIGITS, statement=statement)
    status = json.dumps({"revision": {"active": 1, "sequence": 1, "consecutive_failures": 3,
                                      "control_plane_up": True, "lag_s": float("nan"),
                                      "last_rejection": {"reason": "x\ud800" * 50000}}})
    answers = {"/status": status.encode(),
               "/v1/revision": MAGIC + struct.pack(">I", len(header)) + header + b"\0" * 64,
               "/v1/followers": b'{"followers": []}'}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, partial(serve_hostile, answers), port,
                                        host="127.0.0.1"))
            walked = await acli("status", "--fleet", "--json", "--url", url, check=False)
            assert "Traceback" not in walked.stderr, walked.stderr
            assert "NaN" not in walked.stdout
            (only,) = json.loads(walked.stdout)["replicas"]
            assert only["lag_s"] is None
            assert only["state"] == "refusing" and only["reason"] == "corrupt", only
            assert "\\ud800" in only["detail"] and len(only["detail"].encode()) <= 1024
            nursery.cancel_scope.cancel()


async def test_a_replica_failing_with_a_hostile_detail_is_shown_bounded() -> None:
    # Its error document's detail: 600 KB with lone surrogates, which UTF-8 cannot carry:
    # one line of the table and of --json, bounded.
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    detail = json.dumps({"detail": "x\ud800" * 100000}).encode()

    async def serve_failing(stream: trio.SocketStream) -> None:
        if await read_head(stream) is not None:
            await stream.send_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: "
                                  + str(len(detail)).encode() + b"\r\nconnection: close\r\n\r\n"
                                  + detail)
        await stream.aclose()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, serve_failing, port, host="127.0.0.1"))
            table = await acli("status", "--fleet", "--url", url, check=False)
            assert table.returncode == 1 and "Traceback" not in table.stderr, table.stderr
            assert "answered 500: x" in table.stdout
            assert max(len(line) for line in table.stdout.splitlines()) < 1300
            walked = await acli("status", "--fleet", "--json", "--url", url, check=False)
            (only,) = json.loads(walked.stdout)["replicas"]
            assert only["state"] == "unreachable" and len(only["detail"].encode()) <= 1024
            nursery.cancel_scope.cancel()
