"""POST /v1/converge against the real daemon: outcomes, concurrency, a client that hangs up."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import trio

from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config

TOKEN = "converge-token-0123456789"


def _config(tmp_path: Path, port: int) -> Path:
    token = tmp_path / "admin.token"
    token.write_text(TOKEN + "\n")
    os.chmod(token, 0o600)
    # A poll interval far beyond the test: only a requested attempt can converge in time.
    return write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port,
                        poll_interval_s=3600, extra=f'token_file = "{token}"')


def _bad_revision(tmp_path: Path) -> Path:
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\n[aliases.chat]\nupstream = "https://llm.internal/v1"\n'
                   '[keys.k]\nsecret = "env:TRIO_SUP_TEST_UNSET_SECRET"\naliases = ["chat"]\n')
    return bad


async def test_outcomes_match_the_attempts_and_concurrent_requests_share_them(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = _config(tmp_path, port)
    await acli("publish", "--config", str(config), str(EXAMPLE))
    url = f"http://127.0.0.1:{port}/v1/converge"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
                assert (await client.post(url)).status_code == 401
                answer = await client.post(url, headers=auth)
                assert answer.status_code == 200
                assert answer.json() == {"outcome": "converged", "revision": 1, "reason": None}

                await acli("publish", "--config", str(config), str(EXAMPLE))
                answers: list[dict[str, object]] = []

                async def ask() -> None:
                    response = await client.post(url, headers=auth)
                    answers.append(response.json())

                async with trio.open_nursery() as nursery:
                    for _ in range(10):
                        nursery.start_soon(ask)
                # Each request was answered by an attempt that started after it: all
                # see revision 2, the first of them published it.
                assert len(answers) == 10
                assert {a["revision"] for a in answers} == {2}
                assert {a["outcome"] for a in answers} <= {"published", "converged"}
                assert any(a["outcome"] == "published" for a in answers)

                await acli("publish", "--config", str(config), str(_bad_revision(tmp_path)))
                answer = await client.post(url, headers=auth)
                assert answer.json() == {"outcome": "rejected", "revision": 3, "reason": "secret"}

                # A client that hangs up mid-wait: the loop carries on, the next caller is served.
                with socket.create_connection(("127.0.0.1", port)) as raw:
                    raw.sendall(f"POST /v1/converge HTTP/1.1\r\nHost: x\r\nAuthorization: "
                                f"Bearer {TOKEN}\r\nContent-Length: 0\r\n\r\n".encode())
                answer = await client.post(url, headers=auth)
                assert answer.json()["outcome"] == "rejected"

                # The control plane gone: an outcome, not an HTTP error.
                (tmp_path / "cp.db").rename(tmp_path / "elsewhere.db")
                answer = await client.post(url, headers=auth)
                assert answer.status_code == 200
                assert answer.json() == {"outcome": "failed", "revision": None,
                                         "reason": "unavailable"}
                health = await client.get(f"http://127.0.0.1:{port}/healthz")
                assert health.status_code == 200
            assert not [line for line in daemon.lines if line.get("level") in ("error", "critical")
                        and line.get("event") not in ("revision refused; previous snapshot "
                                                      "keeps serving",)]
