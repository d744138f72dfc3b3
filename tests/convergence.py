"""Building a convergence loop for the unit tests.

A revision body, a loop on a fake store, a metric sample, a loop whose events are watched.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio
import trio.testing

from supervisor.controlplane.store import ControlPlaneStore
from supervisor.convergence.loop import ConvergenceLoop
from supervisor.convergence.signal import ChangeSignal
from supervisor.convergence.status import RevisionStatus
from supervisor.events import EventBus
from supervisor.sinks.lkg import LastKnownGood, generate_signing_key
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics
from tests.fakes.cache import FakeCache
from tests.fakes.store import FakeStore


def doc(*aliases: str, keys: dict[str, list[str]] | None = None) -> bytes:
    body = {
        "schema_version": 1,
        "aliases": {a: {"upstream": f"https://{a}.internal/v1"} for a in aliases},
        "keys": {k: {"secret": f"env:SECRET_{k.upper().replace('-', '_')}", "aliases": v}
                 for k, v in (keys or {}).items()},
    }
    return json.dumps(body).encode()


class Resolver:
    def resolve(self, reference: str) -> bytes:
        return b"value-of-" + reference.encode()


def make(store: ControlPlaneStore, *, state: ActiveState | None = None,
         status: RevisionStatus | None = None, **kw: Any) -> ConvergenceLoop:
    """A loop on ``store``; its status reads ``state`` (a fresh one when neither is given)."""
    params: dict[str, Any] = {
        "status": status or RevisionStatus(state or ActiveState()),
        "metrics": Metrics(process=False),
        "events": EventBus(), "signal": ChangeSignal(), "poll_interval_s": 5.0,
        "backoff_initial_s": 0.25, "backoff_max_s": 30.0, "resolver": Resolver(),
        "rng": random.Random(1),
    }
    params.update(kw)
    return ConvergenceLoop(store, **params)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def real_cache(tmp_path: Path) -> LastKnownGood:
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    key_path = str(keys / "signing.key")
    if not Path(key_path).exists():
        verify = generate_signing_key(key_path)
        (keys / "verify").write_text(verify)
    verify = (keys / "verify").read_text()
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700, exist_ok=True)
    return LastKnownGood(str(directory / "lkg.bin"), signing_key_path=key_path,
                         trusted_keys=[verify], max_schema_version=1)


@dataclass
class Seen:
    """What the outside sees of a reconciler: STATUS= lines and bus events (their JSON form)."""

    status: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def watched(store: FakeStore, **kw: Any) -> tuple[ConvergenceLoop, Seen]:
    seen = Seen()
    bus = EventBus()
    rec = make(store, events=bus, on_status=seen.status.append, **kw)
    sub = bus.subscribe(max_buffer=1000)

    def drain() -> None:
        while True:
            try:
                seen.events.append(msgspec.to_builtins(sub.receive.receive_nowait()))
            except trio.WouldBlock:
                return

    seen.drain = drain  # type: ignore[attr-defined]
    return rec, seen


def events_of(seen: Seen) -> list[dict[str, Any]]:
    seen.drain()  # type: ignore[attr-defined]
    return seen.events


def exported(tmp_path: Path, body: bytes, revision: int = 1) -> LastKnownGood:
    cache = real_cache(tmp_path)
    cache.export(revision=revision, generation=1, schema_version=1, body=body)
    return cache


def with_cache(store: FakeStore, **kw: Any) -> tuple[ConvergenceLoop, FakeCache]:
    holder: list[ConvergenceLoop] = []

    def serving() -> int | None:
        snap = holder[0].state.snapshot
        return None if snap is None else snap.revision

    cache = FakeCache(serving, tempfile.mktemp(prefix="fake-lkg-"))
    rec = make(store, cache=cache, **kw)
    holder.append(rec)
    return rec, cache
