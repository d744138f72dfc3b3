"""Two real daemons configured with the same ``[kubernetes].identity`` (one config file
copied to two VMs), on the fake API server, never fan out both at once.
Helpers from tests/ha.py (lease 4 s, renew 3 s, retry 0.5 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.fakes.apiserver import run_fake_apiserver, write_kubeconfig
from tests.ha import acquired, all_ready, child_writes, lease_writes, replica, sd
from tests.proc import EXAMPLE, acli, run_daemon


@pytest.mark.chaos  # over 10 s through the real process: run by CI's `pytest -m chaos`
async def test_two_daemons_with_one_identity_never_both_fan_out(tmp_path: Path) -> None:
    """b's configuration names a's identity. b finds the Lease holding "its own" name,
    renews it at once and leads while a leads too: both write children and parent status
    (counted by their distinct field managers). Expected: one fan-out, and the collision
    named in the log (or b refused at start)."""
    with trio.fail_after(120):
        async with run_fake_apiserver(bookmark_interval_s=0.5) as server:
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            cp = f"sqlite:///{tmp_path}/cp.db"
            a, b = replica(tmp_path, "a", kubeconfig, cp), replica(tmp_path, "b", kubeconfig, cp)
            text = b.config.read_text()
            assert 'identity = "replica-b"' in text
            b.config.write_text(text.replace('identity = "replica-b"', 'identity = "replica-a"'))
            await acli("publish", "--config", str(a.config), str(EXAMPLE))
            async with run_daemon(a.config) as da:
                await da.wait_log("fan-out leadership acquired")
                async with run_daemon(b.config) as db:
                    await db.wait_log("ready")
                    # b polls a few retry periods (or takes over at once).
                    renewals = len(lease_writes(server, "replica-a"))
                    await server.wait_until(
                        lambda: len(lease_writes(server, "replica-a")) >= renewals + 10)
                    names = [f"web-{i}" for i in range(10)]
                    for name in names:
                        server.create(sd(name))
                    await server.wait_until(lambda: all_ready(server, names))
                    await server.wait_until(
                        lambda: len(lease_writes(server, "replica-a")) >= renewals + 20)
                    b_led = bool(acquired(db))
                    b_writes = child_writes(server, b.manager)
                    a_writes = child_writes(server, a.manager)
                    collision_logged = [line for line in da.lines + db.lines
                                        if "identity" in str(line.get("event", ""))
                                        and line.get("level") in ("warning", "error")]
    assert a_writes, "a (the first leader) wrote nothing: the test did not run its course"
    assert not (b_led and b_writes), (
        f"two daemons with one identity: b led too and made {len(b_writes)} fan-out writes "
        f"next to a's {len(a_writes)}; collision logged: {bool(collision_logged)}")
