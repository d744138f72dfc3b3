"""supervisor.kube.lease over HTTP against the fake API server: the wire format and 409s."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import trio

from supervisor.kube.client import KubeClient
from supervisor.kube.errors import Conflict, DecodeError, Forbidden
from supervisor.kube.lease import KubeLeases, LeaseRecord, micro_time, parse_micro_time
from tests.fakes.apiserver import run_fake_apiserver, write_kubeconfig

MICRO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def test_micro_time_round_trip() -> None:
    moment = datetime(2026, 11, 30, 12, 0, 1, 5, tzinfo=timezone(timedelta(hours=2)))
    text = micro_time(moment)
    assert text == "2026-11-30T10:00:01.000005Z"
    assert parse_micro_time(text) == moment
    assert parse_micro_time("2026-11-30T10:00:01Z") == datetime(2026, 11, 30, 10, 0, 1,
                                                               tzinfo=UTC)
    assert parse_micro_time(None) is None and parse_micro_time("") is None
    with pytest.raises(DecodeError):
        parse_micro_time("yesterday")


async def test_get_create_update_with_optimistic_concurrency(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with run_fake_apiserver() as server:
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            client = KubeClient.from_kubeconfig(str(kubeconfig))
            try:
                leases = KubeLeases(client, "trio-supervisor", "fanout", "replica-a")
                assert leases.where == "trio-supervisor/fanout"
                assert await leases.get() is None
                now = datetime.now(UTC)
                made = await leases.create(LeaseRecord(
                    holder="replica-a", duration_s=15, acquire_time=now, renew_time=now))
                assert made.holder == "replica-a" and made.resource_version
                stored = server.get("leases", "trio-supervisor", "fanout")
                assert stored is not None
                assert MICRO.match(stored["spec"]["renewTime"])
                assert stored["spec"]["leaseDurationSeconds"] == 15
                renewed = await leases.update(made.but(renew_time=datetime.now(UTC)))
                assert renewed.resource_version != made.resource_version
                assert (await leases.get()) == renewed
                with pytest.raises(Conflict):
                    await leases.update(made.but(holder="replica-b"))  # a stale version
                with pytest.raises(Conflict):
                    await leases.create(LeaseRecord(holder="replica-b"))  # already exists
                released = await leases.update(renewed.but(holder=None, duration_s=1))
                assert released.holder is None
                writes = [r for r in server.requests if r.method in ("POST", "PUT")]
                assert {r.field_manager for r in writes} == {"replica-a"}
                server.deny("update", "leases")
                with pytest.raises(Forbidden):
                    await leases.update(released)
            finally:
                await client.aclose()
