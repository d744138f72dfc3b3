"""POST /v1/converge against the real daemon: outcomes, concurrency, a client that hangs up."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from tests.health import metric_sum
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
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
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

                await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
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


def _attempts(metrics: str) -> float:
    return metric_sum(metrics, "supervisor_convergence_attempts_total") or 0.0


@pytest.mark.chaos  # over 10 s through the real process: run by CI's `pytest -m chaos`
async def test_a_flood_of_requests_coalesces_and_shutdown_leaves_none_hanging(
    tmp_path: Path,
) -> None:
    """1,000 requests at once are all answered, by no more attempts than requests; SIGTERM
    with requests in flight ends the daemon within its grace (exit 0), and every request
    ends with it (an answer or a closed connection, never the 60 s deadline)."""
    import signal

    port = free_port()
    config = _config(tmp_path, port)
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    # A connection per request: reusing one the server just closed after its keep-alive
    # timeout (5 s; the flood can take longer on a loaded machine) is the client's race.
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
    with trio.fail_after(120):
        async with run_daemon(config) as daemon, httpx.AsyncClient(
                timeout=60, trust_env=False, limits=limits) as client:
            await daemon.wait_log("ready")
            before = _attempts((await client.get(f"{base}/metrics", headers=auth)).text)
            answers: list[object] = []

            async def ask() -> None:
                response = await client.post(f"{base}/v1/converge", headers=auth)
                answers.append((response.status_code, response.json()))

            async with trio.open_nursery() as nursery:
                for _ in range(1000):
                    nursery.start_soon(ask)
            assert answers == [(200, {"outcome": "converged", "revision": 1, "reason": None})] \
                * 1000
            used = _attempts((await client.get(f"{base}/metrics", headers=auth)).text) - before
            # Never more attempts than requests (those arriving during an attempt share the
            # next one; here attempts take milliseconds, so most requests find none running).
            assert 1 <= used <= 1000, used

            ended: list[str] = []

            async def ask_during_shutdown() -> None:
                try:
                    response = await client.post(f"{base}/v1/converge", headers=auth)
                    ended.append(str(response.status_code))
                except httpx.HTTPError as exc:  # the server closed: an end, not a hang
                    ended.append(type(exc).__name__)

            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(ask_during_shutdown)
                # Every request sent and waiting for its answer (or still connecting):
                # nothing left to run here, then SIGTERM.
                await trio.testing.wait_all_tasks_blocked(cushion=0.01)
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0, "\n".join(daemon.raw[-30:])
            # grace_s is 5: nobody waited for the 60 s request deadline.
            assert trio.current_time() - started < 10
            assert len(ended) == 100
