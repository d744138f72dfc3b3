"""``GET /v1/followers`` over a real admin server: a follower named on its stream
handshake is listed, and the read token is enough to list them."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from supervisor.admin.auth import admin_tokens
from supervisor.controlplane.replica_name import HEADERS
from tests.adminserver import make_ctx, owned_ws, running_admin


async def test_a_follower_named_on_its_stream_is_listed_to_a_read_token(tmp_path: Path) -> None:
    (tmp_path / "full").write_text("full-token-0123456789abcdef\n")
    (tmp_path / "read").write_text("read-token-0123456789abcdef\n")
    full, read = admin_tokens(str(tmp_path / "full"), str(tmp_path / "read"))
    ctx = make_ctx(full)
    ctx.read_token = read
    named = [(HEADERS["url"].encode(), b"http://f9:9464"), (HEADERS["sequence"].encode(), b"4"),
             (HEADERS["state"].encode(), b"refusing"), (HEADERS["reason"].encode(), b"secret"),
             (b"authorization", f"Bearer {read}".encode())]
    with trio.fail_after(30):
        async with running_admin(ctx) as admin:
            async with owned_ws(admin.host, admin.port, named) as ws:
                await ws.get_message()  # the first status message: the handshake was accepted
            async with httpx.AsyncClient(base_url=admin.base) as http:
                denied = await http.get("/v1/followers")
                answer = await http.get("/v1/followers",
                                        headers={"authorization": f"Bearer {read}"})
    assert denied.status_code == 401
    assert answer.status_code == 200
    [row] = answer.json()["followers"]
    assert (row["url"], row["sequence"], row["state"], row["reason"]) == (
        "http://f9:9464", 4, "refusing", "secret")
