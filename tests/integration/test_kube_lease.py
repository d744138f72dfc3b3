"""supervisor.kube.lease over HTTP against the fake API server: the wire format and 409s."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import msgspec
import pytest
import trio

from supervisor.kube.client import KubeClient
from supervisor.kube.errors import Conflict, DecodeError, Forbidden, SchemaSkew
from supervisor.kube.lease import (
    BadLease,
    KubeLeases,
    LeaseRecord,
    lease_record,
    micro_time,
)
from tests.fakes.apiserver import run_fake_apiserver, write_kubeconfig

MICRO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def test_micro_time_round_trip() -> None:
    moment = datetime(2026, 11, 30, 12, 0, 1, 5, tzinfo=timezone(timedelta(hours=2)))
    text = micro_time(moment)
    assert text == "2026-11-30T10:00:01.000005Z"
    assert renewed_at(text) == moment
    assert renewed_at("2026-11-30T10:00:01Z") == datetime(2026, 11, 30, 10, 0, 1, tzinfo=UTC)
    assert renewed_at(None) is None
    with pytest.raises(DecodeError):
        renewed_at("yesterday")


def test_lease_times_as_other_clients_write_them() -> None:
    # Any offset is the instant it names; nanoseconds (Go's RFC3339Nano) round to the
    # microsecond; a year outside 1..9999, an empty time or one without a zone (RFC 3339
    # requires it; compared with now it would raise) is SchemaSkew at its path.
    assert renewed_at("2026-11-30T12:00:01+02:00") == datetime(2026, 11, 30, 10, 0, 1,
                                                                tzinfo=UTC)
    assert renewed_at("2026-11-30T10:00:01.123456789Z") == datetime(
        2026, 11, 30, 10, 0, 1, 123457, tzinfo=UTC)
    for text in ("10000-01-01T00:00:00Z", "0000-01-01T00:00:00Z", "", "2026-11-30T10:00:01"):
        with pytest.raises(SchemaSkew) as skew:
            renewed_at(text)
        assert skew.value.path == "$.spec.renewTime"
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"resourceVersion": "1"}, "spec": {"holderIdentity": "a"}}
    record = lease_record(msgspec.json.encode(body), "ns/lease")
    assert record.renew_time is None and record.acquire_time is None


def renewed_at(text: str | None) -> datetime | None:
    """The renewTime a Lease answer carrying ``text`` is read as."""
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"resourceVersion": "1"}, "spec": {"renewTime": text}}
    return lease_record(msgspec.json.encode(body), "ns/lease").renew_time


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
                renewed = await leases.update(replace(made, renew_time=datetime.now(UTC)))
                assert renewed.resource_version != made.resource_version
                assert (await leases.get()) == renewed
                with pytest.raises(Conflict):
                    await leases.update(replace(made, holder="replica-b"))  # a stale version
                with pytest.raises(Conflict):
                    await leases.create(LeaseRecord(holder="replica-b"))  # already exists
                released = await leases.update(replace(renewed, holder=None, duration_s=1))
                assert released.holder is None
                writes = [r for r in server.requests if r.method in ("POST", "PUT")]
                assert {r.field_manager for r in writes} == {"replica-a"}
                server.deny("update", "leases")
                with pytest.raises(Forbidden):
                    await leases.update(released)
            finally:
                await client.aclose()


async def test_update_keeps_the_lease_as_read_and_replaces_only_election_fields(
        tmp_path: Path) -> None:
    """Labels, annotations and spec fields this build does not know (1.31's ``strategy``,
    ``preferredHolder``) survive acquire, renew and release, as with client-go's
    LeaseLock; the fields election owns are replaced, the times removed when unset."""
    with trio.fail_after(30):
        async with run_fake_apiserver() as server:
            server.create({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "fanout", "namespace": "trio-supervisor",
                             "labels": {"team": "platform"}, "annotations": {"note": "keep"}},
                "spec": {"holderIdentity": "old", "acquireTime": "2026-01-01T00:00:00.000000Z",
                         "strategy": "OldestEmulationVersion", "preferredHolder": "replica-b"}},
                field_manager="kubectl")
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            client = KubeClient.from_kubeconfig(str(kubeconfig))
            try:
                leases = KubeLeases(client, "trio-supervisor", "fanout", "replica-a")
                current = await leases.get()
                assert current is not None
                now = datetime.now(UTC)
                won = await leases.update(replace(
                    current,
                    holder="replica-a", duration_s=15, acquire_time=None, renew_time=now,
                    transitions=1))
                await leases.update(replace(won, holder=None, duration_s=1))
            finally:
                await client.aclose()
            stored = server.get("leases", "trio-supervisor", "fanout")
    assert stored is not None
    assert stored["metadata"]["labels"] == {"team": "platform"}
    assert stored["metadata"]["annotations"] == {"note": "keep"}
    spec = stored["spec"]
    assert spec["strategy"] == "OldestEmulationVersion" and spec["preferredHolder"] == "replica-b"
    assert spec.get("holderIdentity") is None and spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 1 and "acquireTime" not in spec
    assert MICRO.match(spec["renewTime"])


@pytest.mark.parametrize(("answer", "what"), [
    ({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
      "metadata": {"name": "fanout", "namespace": "trio-supervisor"}}, "resourceVersion"),
    ({"apiVersion": "v1", "kind": "ConfigMap",
      "metadata": {"name": "fanout", "resourceVersion": "7"}}, "ConfigMap"),
])
async def test_an_answer_that_is_not_a_writable_lease_is_a_bad_lease(
        tmp_path: Path, answer: dict[str, object], what: str) -> None:
    """Without a resourceVersion no write can be conditional, and another kind is not a
    Lease: both are BadLease (a DecodeError naming what is wrong), never a free Lease;
    and update sends no PUT for a record without a resourceVersion."""
    with trio.fail_after(30):
        async with run_fake_apiserver() as server:
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            client = KubeClient.from_kubeconfig(str(kubeconfig))
            try:
                leases = KubeLeases(client, "trio-supervisor", "fanout", "replica-a")
                server.inject("GET", r"/leases/fanout$", status=200, times=None, body=answer)
                with pytest.raises(BadLease, match=what):
                    await leases.get()
                with pytest.raises(BadLease, match="resourceVersion"):
                    await leases.update(LeaseRecord(holder="replica-a", duration_s=15))
            finally:
                await client.aclose()
            assert not [r for r in server.requests if r.method == "PUT"]
