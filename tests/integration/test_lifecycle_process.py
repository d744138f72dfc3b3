"""The lifecycle commands against the real daemon: publish --wait, and rollback then a cold boot."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import httpx
import trio

from tests.cacheprocess import cache_config, keys
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config
from tests.tcpproxy import pg_proxy
from tests.tcpproxy import proxied_url as proxied

TOKEN = "lifecycle-token-0123456789"
UNSET = "TRIO_SUP_WAIT_UNSET_SECRET"


def _variant(tmp_path: Path, name: str, secret: str = "file:conf/example.key",
             timeout_s: int = 7) -> Path:
    path = tmp_path / name
    path.write_text(
        f'schema_version = 1\n[aliases.chat]\nupstream = "https://llm.internal/v1"\n'
        f"timeout_s = {timeout_s}\n"
        f'[keys.k]\nsecret = "{secret}"\naliases = ["chat"]\n'
    )
    return path


async def test_publish_wait_on_two_replicas_active_refused_and_stopped(tmp_path: Path) -> None:
    token = tmp_path / "admin.token"
    token.write_text(TOKEN)
    os.chmod(token, 0o600)
    url = f"sqlite:///{tmp_path}/cp.db"
    ports = [free_port(), free_port()]
    configs = []
    for i, port in enumerate(ports):
        home = tmp_path / f"replica{i}"
        home.mkdir()
        # Polling once an hour: only the stream plus the converge request can be this fast.
        configs.append(write_config(home, url, f'token_file = "{token}"', port=port,
                                    poll_interval_s=3600))
    await acli("publish", "--config", str(configs[0]), str(EXAMPLE), "--force")

    # The second replica is named by its stream URL: the converge request must
    # still reach it (it polls once an hour), on its http:// address.
    streamed = f"ws://127.0.0.1:{ports[1]}/v1/stream"

    def wait(timeout_s: int = 20) -> tuple[str, ...]:
        return ("--wait", "--token-file", str(token), "--timeout", str(timeout_s),
                "--url", f"http://127.0.0.1:{ports[0]}", "--url", streamed)

    with trio.fail_after(120):
        async with run_daemon(configs[0]) as first, run_daemon(configs[1]) as second:
            await first.wait_log("ready")
            await second.wait_log("ready")

            good = await acli("publish", "--config", str(configs[0]),
                              str(_variant(tmp_path, "good.toml")), *wait(), check=False)
            assert good.returncode == 0, good.stdout + good.stderr
            lines = good.stdout.splitlines()
            assert lines[-1] == "2"
            assert f"http://127.0.0.1:{ports[0]}: revision 2 active" in lines
            assert f"{streamed}: revision 2 active" in lines
            await first.wait_log("published", revision=2)
            await second.wait_log("published", revision=2)
            urls = ("--url", f"http://127.0.0.1:{ports[0]}", "--url", f"http://127.0.0.1:{ports[1]}")
            fleet = await acli("status", *urls, "--token-file", str(token))
            rows = fleet.stdout.splitlines()
            assert rows[0].split() == ["REPLICA", "DESIRED", "ACTIVE", "SOURCE", "CP", "UP",
                                       "FAILURES", "VERSION", "STATE"]
            assert [r.split()[:4] for r in rows[1:]] == [
                [f"http://127.0.0.1:{p}", "2", "2", "control_plane"] for p in ports]

            bad = await acli("publish", "--config", str(configs[0]),
                             str(_variant(tmp_path, "bad.toml", secret=f"env:{UNSET}")), *wait(),
                             check=False)
            assert bad.returncode == 5, bad.stdout + bad.stderr
            last = bad.stdout.splitlines()[-1]
            assert last == (f"refused: secret: $.keys.k.secret: environment variable {UNSET} "
                            "is not set or empty")
            assert "revision 3 refused (secret)" in bad.stdout

            second.signal(signal.SIGTERM)
            assert await second.wait() == 0
            started = trio.current_time()
            late = await acli("publish", "--config", str(configs[0]),
                              str(_variant(tmp_path, "late.toml", timeout_s=9)),
                              *wait(3), check=False)
            assert late.returncode == 1, late.stdout + late.stderr
            assert trio.current_time() - started >= 3.0
            assert f"http://127.0.0.1:{ports[0]}: revision 4 active" in late.stdout
            assert f"{streamed}: timeout: revision 4 not active after 3 s" \
                in late.stdout
            assert "unreachable" in late.stdout
            fleet = await acli("status", *urls, "--token-file", str(token), check=False)
            assert fleet.returncode == 1
            assert fleet.stdout.splitlines()[1].split()[:3] == [
                f"http://127.0.0.1:{ports[0]}", "4", "4"]
            assert "unreachable" in fleet.stdout.splitlines()[2]


async def test_rollback_then_cold_boot_serves_the_rolled_back_revision_from_cache(
    tmp_path: Path, pg_url: str,
) -> None:
    key, verify = keys(tmp_path)
    port, admin_port = free_port(), free_port()
    config = cache_config(tmp_path, proxied(pg_url, port), key, [verify], admin_port=admin_port)
    # An hour between polls: the rollback reaches the daemon by its NOTIFY, as a publish does.
    config.write_text(config.read_text().replace("poll_interval_s = 1.0",
                                                 "poll_interval_s = 3600"))
    async with pg_proxy(port, pg_url) as proxy:
        await acli("db", "migrate", "--config", str(config))
        await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
        await acli("publish", "--config", str(config), str(_variant(tmp_path, "two.toml")))
        with trio.fail_after(60):
            async with run_daemon(config) as daemon:
                await daemon.wait_log("published", revision=2)
                await daemon.wait_log("listening for desired-state notifications")
                rolled = await acli("rollback", "1", "--config", str(config),
                                    "--message", "two broke")
                assert rolled.stdout.splitlines()[-1] == "1"
                await daemon.wait_log("published", revision=1)
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0
        assert (tmp_path / "cache" / "lkg.bin.served").read_text().strip() == "1"
        proxy.stop()
        with trio.fail_after(60):
            async with run_daemon(config) as daemon:
                line = await daemon.wait_log("serving the last-known-good cache")
                assert line["revision"] == 1 and line["cause"] == "unavailable"
                async with httpx.AsyncClient(trust_env=False) as client:
                    status = (await client.get(f"http://127.0.0.1:{admin_port}/status")).json()
                assert status["revision"]["source"] == "last_known_good"
                assert status["revision"]["active"] == 1
                assert not [x for x in daemon.lines if "rollback" in str(x.get("reason"))
                            or x.get("event") == "refused to boot"]


async def _bash(script: str, cwd: Path) -> tuple[int, list[str]]:
    """``script`` in a real ``bash -o pipefail`` (as a deploy pipeline runs it): its exit
    status and the lines of ``pipeline.log`` it tees."""
    import subprocess

    result = await trio.to_thread.run_sync(lambda: subprocess.run(
        ["bash", "-o", "pipefail", "-c", script], cwd=cwd, capture_output=True, text=True,
        timeout=60, check=False))
    return result.returncode, (cwd / "pipeline.log").read_text().splitlines()


async def test_a_refused_publish_fails_a_shell_pipeline_with_the_reason_last(
    tmp_path: Path,
) -> None:
    script = str(Path(sys.executable).parent / "trio-supervisor")
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port,
                          poll_interval_s=3600)
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    bad = _variant(tmp_path, "bad.toml", secret=f"env:{UNSET}")
    reason = f"refused: secret: $.keys.k.secret: environment variable {UNSET} is not set or empty"
    # Refused here, before anything is stored (stderr, so the pipeline merges it).
    code, lines = await _bash(
        f"{script} publish --config {config} {bad} --resolve-secrets 2>&1 | tee pipeline.log",
        tmp_path)
    assert code == 2, lines
    assert lines[-1] == f"refused: secret: {bad}: {reason.removeprefix('refused: secret: ')}" \
        "; nothing was stored"
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            # Refused by the replica: the pipeline fails with exit 5 and the reason last.
            code, lines = await _bash(
                f"{script} publish --config {config} {bad} --wait --timeout 30 "
                f"| tee pipeline.log", tmp_path)
            assert code == 5, lines
            assert lines[-1] == reason
            # The same command on a good revision: the pipeline succeeds, the id last.
            good = _variant(tmp_path, "good.toml")
            code, lines = await _bash(
                f"{script} publish --config {config} {good} --wait --timeout 30 "
                f"| tee pipeline.log", tmp_path)
            assert code == 0 and lines[-1] == "3", lines
            # --json: one document for scripts, same exit codes.
            base = f"http://127.0.0.1:{port}"
            as_json = await acli("publish", "--config", str(config), str(bad), "--wait",
                                 "--json", check=False)
            assert as_json.returncode == 5, as_json.stdout + as_json.stderr
            assert json.loads(as_json.stdout) == {
                "ok": False, "revision": 4, "sequence": 4, "unchanged": False,
                "store": f"{tmp_path}/cp.db", "outcome": "refused",
                "replicas": [{"url": base, "state": "refused", "reason": "secret",
                              "detail": reason.removeprefix("refused: secret: ")}],
                # The failure document's pair, naming the replica that decided.
                "reason": "secret",
                "detail": f"{base}: refused: {reason.removeprefix('refused: secret: ')}"}
            as_json = await acli("publish", "--config", str(config), str(good), "--wait",
                                 "--json", check=False)
            assert as_json.returncode == 0, as_json.stdout + as_json.stderr
            assert json.loads(as_json.stdout) == {
                "ok": True, "revision": 5, "sequence": 5, "unchanged": False,
                "store": f"{tmp_path}/cp.db", "outcome": "active",
                "replicas": [{"url": base, "state": "active", "reason": None, "detail": None}],
                "reason": None, "detail": None}


async def test_publish_wait_follows_a_replica_that_comes_back_mid_wait(tmp_path: Path) -> None:
    """The replica is down when --wait starts (a restart, a deploy): the waiter keeps trying
    until its deadline, and the replica's first stream message after its boot decides."""
    import subprocess

    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port,
                          poll_interval_s=3600)
    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
    script = str(Path(sys.executable).parent / "trio-supervisor")
    with trio.fail_after(90):
        waiter = await trio.lowlevel.open_process(
            [script, "publish", "--config", str(config), str(_variant(tmp_path, "two.toml")),
             "--wait", "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert waiter.stdout is not None
        # Its commit is done once it says so; the replica is not running yet.
        seen = b""
        while b"published revision 2 " not in seen:
            chunk = await waiter.stdout.receive_some()
            assert chunk, seen
            seen += chunk
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            while chunk := await waiter.stdout.receive_some():
                seen += chunk
            assert await waiter.wait() == 0, seen
            assert seen.decode().splitlines()[-2:] == [
                f"http://127.0.0.1:{port}: revision 2 active", "2"]
