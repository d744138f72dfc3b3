"""The rollout check against the real daemon: ``status --check`` is exit 0 only when the
replica serves the desired revision and refused nothing that matters; ``rollback`` to a
revision the replica's last refusal names asks for ``--force``; ``/status`` names the
build and when it started, and the fleet table shows the version."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from supervisor import __version__
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config

UNSET = "TRIO_SUP_ROLLOUT_UNSET_SECRET"


def _variant(tmp_path: Path, name: str, secret: str = "file:conf/example.key",
             timeout_s: int = 7) -> Path:
    path = tmp_path / name
    path.write_text(
        f'schema_version = 1\n[aliases.chat]\nupstream = "https://llm.internal/v1"\n'
        f"timeout_s = {timeout_s}\n"
        f'[keys.k]\nsecret = "{secret}"\naliases = ["chat"]\n'
    )
    return path


async def test_status_check_and_rollback_follow_what_the_replica_refused(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = str(write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port,
                              poll_interval_s=3600))
    await acli("publish", "--config", config, str(EXAMPLE))
    with trio.fail_after(120):
        async with run_daemon(Path(config)) as daemon:
            await daemon.wait_log("ready")
            done = await acli("status", "--config", config, "--check", check=False)
            assert done.returncode == 0, done.stderr
            doc = json.loads((await acli("status", "--config", config, "--json")).stdout)
            assert doc["version"] == __version__ and doc["started_at"].endswith("Z")
            fleet = (await acli("status", "--url", base, "--url", base)).stdout.splitlines()
            assert fleet[0].split()[-2:] == ["VERSION", "STATE"]
            assert fleet[1].split()[-2:] == [__version__, "ok"]

            bad = await acli("publish", "--config", config, "--wait", "--timeout", "30",
                             str(_variant(tmp_path, "bad.toml", secret=f"env:{UNSET}")),
                             check=False)
            assert bad.returncode == 5, bad.stdout + bad.stderr
            plain = await acli("status", "--config", config, check=False)
            assert plain.returncode == 0  # up and serving revision 1
            refused = await acli("status", "--config", config, "--check", check=False)
            assert refused.returncode == 1
            assert "status: active revision 1, desired 2" in refused.stderr
            assert "status: refused revision 2 (secret)" in refused.stderr

            good = await acli("publish", "--config", config, "--wait", "--timeout", "30",
                              str(_variant(tmp_path, "good.toml")), check=False)
            assert good.returncode == 0, good.stdout + good.stderr
            # A refusal of a revision no longer desired is history, not a failed rollout.
            assert (await acli("status", "--config", config, "--check",
                               check=False)).returncode == 0

            asked = await acli("rollback", "2", "--config", config, "--message", "retry",
                               "--json", check=False)
            assert asked.returncode == 2
            answer = json.loads(asked.stdout)
            assert answer["ok"] is False and answer["reason"] == "invalid"
            assert f"{base} refused revision 2" in answer["detail"]
            assert ": secret: $.keys.k.secret" in answer["detail"]
            assert "--force" in answer["detail"] and "desired was not changed" in answer["detail"]
            history = json.loads((await acli("history", "--config", config, "--json")).stdout)
            assert history["desired"] == 3

            forced = await acli("rollback", "2", "--config", config, "--force", "--json")
            assert json.loads(forced.stdout)["previous"] == 3
            plain_rollback = await acli("rollback", "1", "--config", config, "--message", "ok")
            assert plain_rollback.stdout.splitlines()[-1] == "1"


async def test_rollback_refuses_an_older_id_with_the_body_a_replica_refused(tmp_path: Path) -> None:
    """A refusal is about content: the same body under another id is refused as well."""
    port = free_port()
    config = str(write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port,
                              poll_interval_s=3600))
    await acli("publish", "--config", config, str(EXAMPLE))
    bad = str(_variant(tmp_path, "bad.toml", secret=f"env:{UNSET}"))
    with trio.fail_after(180):
        async with run_daemon(Path(config)) as daemon:
            await daemon.wait_log("ready")
            first = await acli("publish", "--config", config, "--wait", "--timeout", "30", bad,
                               check=False)
            assert first.returncode == 5, first.stdout + first.stderr  # revision 2 refused
            good = await acli("publish", "--config", config, "--wait", "--timeout", "30",
                              str(_variant(tmp_path, "good.toml")), check=False)
            assert good.returncode == 0, good.stdout + good.stderr  # revision 3
            again = await acli("publish", "--config", config, "--force", "--wait",
                               "--timeout", "30", bad, check=False)
            assert again.returncode == 5, again.stdout + again.stderr  # revision 4, same body
            asked = await acli("rollback", "2", "--config", config, check=False)
            assert asked.returncode == 2, asked.stdout + asked.stderr
            assert "refused revision 4 (the same body as revision 2)" in asked.stderr
            assert "desired was not changed" in asked.stderr
            history = json.loads((await acli("history", "--config", config, "--json")).stdout)
            assert history["desired"] == 4
