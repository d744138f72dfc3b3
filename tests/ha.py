"""Two (or more) real daemon replicas on one Kubernetes API server: shared test helpers.

Each replica has its own directory, admin port, Lease ``identity`` (``replica-<x>``)
and child ``field_manager`` (``mgr-<x>``), so the API server's records tell
which replica wrote what: :func:`child_writes` counts one replica's writes of
fan-out objects (children, parent status, Events), never the Lease's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.fakes.apiserver import FakeApiServer, RecordedRequest
from tests.proc import Daemon, free_port, write_config

GROUP = "platform.trio-supervisor.dev/v1"
CONTROL, APPS = "trio-supervisor", "apps"
LEASE_NAME = "trio-supervisor-fanout"


@dataclass(frozen=True)
class Timings:
    lease_duration_s: float = 5.0
    renew_deadline_s: float = 3.0
    retry_period_s: float = 0.5


@dataclass
class Replica:
    name: str
    config: Path
    port: int

    @property
    def identity(self) -> str:
        return f"replica-{self.name}"

    @property
    def manager(self) -> str:
        return f"mgr-{self.name}"

    async def status(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10) as client:
            return (await client.get(f"http://127.0.0.1:{self.port}/status")).json()  # type: ignore[no-any-return]

    async def get(self, path: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as client:
            return await client.get(f"http://127.0.0.1:{self.port}{path}")


def replica(tmp_path: Path, name: str, kubeconfig: Path, cp_url: str,
            timings: Timings = Timings()) -> Replica:
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    port = free_port()
    extra = (f'\n[kubernetes]\nenabled = true\nkubeconfig = "{kubeconfig}"\n'
             f'control_namespace = "{CONTROL}"\napps_namespace = "{APPS}"\n'
             "preflight_retry_s = 1\n"
             f'identity = "replica-{name}"\nfield_manager = "mgr-{name}"\n'
             f"lease_duration_s = {timings.lease_duration_s}\n"
             f"renew_deadline_s = {timings.renew_deadline_s}\n"
             f"retry_period_s = {timings.retry_period_s}\n")
    config = write_config(directory, cp_url, extra, port=port)
    return Replica(name, config, port)


def sd(name: str) -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": "ServiceDefinition",
            "metadata": {"name": name, "namespace": CONTROL},
            "spec": {"image": "nginx:1.27", "replicas": 1}}


WRITES = ("POST", "PUT", "PATCH", "DELETE")


def child_writes(server: FakeApiServer, manager: str) -> list[RecordedRequest]:
    """Fan-out writes by ``manager``: children, parent status (everything but the Lease)."""
    return [r for r in server.requests
            if r.method in WRITES and r.field_manager == manager and "/leases" not in r.path]


def lease_writes(server: FakeApiServer, identity: str, *, ok: bool = True,
                 ) -> list[RecordedRequest]:
    return [r for r in server.requests
            if r.method in ("POST", "PUT") and "/leases" in r.path
            and r.field_manager == identity and (not ok or r.status in (200, 201))]


def is_ready(obj: dict[str, Any] | None) -> bool:
    if obj is None:
        return False
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def all_ready(server: FakeApiServer, names: Iterable[str]) -> bool:
    return all(is_ready(server.get("servicedefinitions", CONTROL, name))
               and server.get("deployments", APPS, name) is not None for name in names)


def log_time(line: dict[str, Any]) -> float:
    """A JSON log line's ``timestamp`` as a POSIX time (the replicas share one host clock)."""
    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


def acquired(daemon: Daemon) -> list[dict[str, Any]]:
    return [line for line in daemon.lines if line.get("event") == "fan-out leadership acquired"]


async def first_leader(daemons: dict[str, Daemon]) -> str:
    """The replica whose log says it acquired the fan-out lease (waits for one)."""
    found: list[str] = []

    async def watch(name: str, daemon: Daemon, scope: trio.CancelScope) -> None:
        await daemon.wait_log("fan-out leadership acquired")
        found.append(name)
        scope.cancel()

    async with trio.open_nursery() as nursery:
        for name, daemon in daemons.items():
            nursery.start_soon(watch, name, daemon, nursery.cancel_scope)
    return found[0]
