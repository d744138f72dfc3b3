"""Building a convergence loop for the unit tests.

A revision body, a loop on a fake store, a metric sample, a loop whose events are watched,
a loop on a fake or a real signed cache, a resolver that cannot read its secrets.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio
import trio.testing

from supervisor import reasons
from supervisor.config import CacheConfig, ControlPlaneConfig
from supervisor.controlplane.store import RevisionSource
from supervisor.convergence.loop import ConvergenceLoop, Reporting
from supervisor.convergence.side_sinks import SideSinks, SinkStatus
from supervisor.convergence.signal import ChangeSignal
from supervisor.convergence.status import RevisionStatus
from supervisor.events import EventBus
from supervisor.revision.errors import RevisionError
from supervisor.sinks.lkg import LastKnownGood, generate_signing_key
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics
from tests.fakes.cache import FakeCache
from tests.fakes.store import FakeStore

if TYPE_CHECKING:
    from supervisor.revision.secrets import SecretResolver
    from supervisor.sinks.file import SnapshotFile


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


RESOLVER = Resolver()


class UnavailableResolver:
    """A resolver meeting a transient shortage (EMFILE) at every secret."""

    def resolve(self, reference: str) -> bytes:
        raise RevisionError(reasons.UNAVAILABLE, "EMFILE: too many open files")


#: The cache's counter (``event``: restored, refused, exported, export_failed...).
LKG_EVENTS = "supervisor_last_known_good_events_total"


def make(store: RevisionSource, *, state: ActiveState | None = None,
         status: RevisionStatus | None = None, metrics: Metrics | None = None,
         events: EventBus | None = None, signal: ChangeSignal | None = None,
         poll_interval_s: float = 5.0, backoff_initial_s: float = 0.25,
         backoff_max_s: float = 30.0, serve_cache_on_refusal: bool = False,
         statement_ttl_s: float = 300.0, cache: Any = None,
         snapshot_file: SnapshotFile | None = None, sink_status: SinkStatus | None = None,
         forward_to: str | None = None, on_status: Callable[[str], None] | None = None,
         on_outage_change: Callable[[bool], None] | None = None,
         resolver: SecretResolver | None = RESOLVER, rng: random.Random | None = None,
         **kw: Any) -> ConvergenceLoop:
    """A loop on ``store``; its status reads ``state`` (a fresh one when neither is given).

    The keywords are the settings and collaborators a test varies, spelt flat.
    """
    metrics = metrics or Metrics(process=False)
    report = Reporting(status=status or RevisionStatus(state or ActiveState()), metrics=metrics,
                       events=events or EventBus(),
                       on_status=on_status or (lambda _text: None),
                       on_outage_change=on_outage_change or (lambda _down: None))
    return ConvergenceLoop(
        store,
        control_plane=ControlPlaneConfig(poll_interval_s=poll_interval_s,
                                         backoff_initial_s=backoff_initial_s,
                                         backoff_max_s=backoff_max_s),
        cache=CacheConfig(serve_when_desired_refused=serve_cache_on_refusal,
                          statement_ttl_s=statement_ttl_s),
        report=report,
        sinks=SideSinks(metrics, cache=cache, snapshot_file=snapshot_file, status=sink_status,
                        forward_to=forward_to),
        signal=signal or ChangeSignal(), resolver=resolver, rng=rng or random.Random(1), **kw)


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


class WrappedCache:
    """The real signed cache (on ``tmp_path``) behind the surface the loop uses.

    A test subclasses it to change what ``export`` does around the real write.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.real = real_cache(tmp_path)
        self.path = self.real.path
        self.paths = self.real.paths
        self.signing_key_id = self.real.signing_key_id

    def export(self, **kw: Any) -> None:
        self.real.export(**kw)

    def discard_if_newer(self, revision: int, body_sha256: bytes | None = None) -> bool:
        return self.real.discard_if_newer(revision, body_sha256)

    def forget_files(self) -> None:
        self.real.forget_files()


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
