"""Fan-out at scale: N ServiceDefinitions against the in-process fake API server.

Run from the repository root::

    python -m bench.bench_fanout [--parents 1000] [--port-every 2] [--workers 8]

Prints:

- time from starting the reconciler until every child is applied and every
  parent reports Ready (preflight, list, applies, status writes; the fake API
  server runs in the same process and its time is included);
- requests per parent to converge (all requests, and the writes among them);
  every second parent has a ``port`` (Deployment + Service + status = 3
  writes), the others 2;
- requests and writes of a resync when nothing changed (writes: aim 0);
- writes of a restarted reconciler against the converged state (aim 0);
- memory per watched object: what the reconciler's own code holds after a
  restart's list and resync, measured with tracemalloc (allocations made in
  ``supervisor/`` files), divided by N.
"""

from __future__ import annotations

import argparse
import gc
import logging
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import structlog
import trio

from supervisor.config import KubernetesConfig
from supervisor.fanout.engine import FanoutEngine, FanoutTuning
from supervisor.fanout.servicedefinition import SERVICE_DEFINITION
from supervisor.fanout.status import FanoutStatus
from supervisor.kube.client import KubeClient
from supervisor.kube.watching import WatchTuning
from supervisor.telemetry import Metrics
from tests.fakes.apiserver import FakeApiServer, run_fake_apiserver, write_kubeconfig

CONTROL, APPS = "trio-supervisor", "apps"


def parent(i: int, port_every: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": f"registry.example/app-{i}:1.0",
        "replicas": 1 + i % 3,
        "env": {"INDEX": str(i), "MODE": "bench"},
    }
    if port_every and i % port_every == 0:
        spec["port"] = 8000 + i % 1000
    return {
        "apiVersion": "platform.trio-supervisor.dev/v1",
        "kind": "ServiceDefinition",
        "metadata": {"name": f"svc-{i:05d}", "namespace": CONTROL},
        "spec": spec,
    }


def converged(fake: FakeApiServer, n: int) -> bool:
    store = fake.store.objects
    if len(store["deployments"]) < n:
        return False
    for obj in store["servicedefinitions"].values():
        status = obj.get("status") or {}
        if status.get("observedGeneration") != obj["metadata"].get("generation"):
            return False
    return True


async def wait_idle(reconciler: FanoutEngine[Any]) -> None:
    await reconciler.synced.wait()
    await reconciler.queue.wait_idle()


def summarize(requests: list[Any]) -> str:
    counts = Counter(f"{r.method}{' watch' if r.watch else ''}" for r in requests)
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


async def main(args: argparse.Namespace) -> None:
    n = args.parents
    tuning = FanoutTuning(watch=WatchTuning(), workers=args.workers, resync_s=3600.0)
    async with run_fake_apiserver(bookmark_interval_s=5.0) as fake:
        for i in range(n):
            fake.create(parent(i, args.port_every))
        with_port = sum(1 for i in range(n) if args.port_every and i % args.port_every == 0)
        tmp = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
        write_kubeconfig(fake, tmp / "kubeconfig")
        config = KubernetesConfig(enabled=True, kubeconfig=str(tmp / "kubeconfig"))
        fake.clear_requests()

        # 1. Converge from nothing.
        client = KubeClient.from_kubeconfig(config.kubeconfig)
        reconciler = FanoutEngine(
            client, SERVICE_DEFINITION, config, Metrics(process=False), FanoutStatus(), tuning
        )
        async with trio.open_nursery() as nursery:
            start = time.perf_counter()
            await nursery.start(reconciler.run)
            while not converged(fake, n):
                await trio.sleep(0.02)
            elapsed = time.perf_counter() - start
            await wait_idle(reconciler)
            converge_requests = list(fake.requests)
            writes = [r for r in converge_requests if r.method != "GET"]
            print(f"parents: {n} ({with_port} with a port: Deployment + Service)")
            print(f"converged in {elapsed:.2f} s ({n / elapsed:.0f} parents/s)")
            print(
                f"requests to converge: {len(converge_requests)} "
                f"= {len(converge_requests) / n:.2f} per parent "
                f"(writes {len(writes) / n:.2f} per parent) [{summarize(converge_requests)}]"
            )

            # 2. A resync with nothing changed.
            fake.clear_requests()
            start = time.perf_counter()
            await reconciler.resync()
            await wait_idle(reconciler)
            resync_s = time.perf_counter() - start
            resync_writes = [r for r in fake.requests if r.method != "GET"]
            print(
                f"resync with nothing changed: {len(fake.requests)} requests, "
                f"{len(resync_writes)} writes, {resync_s * 1000:.0f} ms "
                f"[{summarize(fake.requests)}]"
            )
            nursery.cancel_scope.cancel()
        await client.aclose()

        # 3. A restart against the converged state, under tracemalloc.
        fake.clear_requests()
        del reconciler
        gc.collect()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        client = KubeClient.from_kubeconfig(config.kubeconfig)
        restarted = FanoutEngine(
            client, SERVICE_DEFINITION, config, Metrics(process=False), FanoutStatus(), tuning
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(restarted.run)
            await wait_idle(restarted)
            gc.collect()
            after = tracemalloc.take_snapshot()
            ours = [tracemalloc.Filter(True, "*/supervisor/*")]
            held = sum(
                stat.size_diff
                for stat in after.filter_traces(ours).compare_to(
                    before.filter_traces(ours), "filename"
                )
            )
            nursery.cancel_scope.cancel()
        tracemalloc.stop()
        await client.aclose()
        restart_writes = [r for r in fake.requests if r.method != "GET"]
        print(
            f"restart against converged state: {len(fake.requests)} requests, "
            f"{len(restart_writes)} writes"
        )
        print(
            f"memory per watched object: {held / n:.0f} B "
            f"({held / 1024:.0f} KiB held by supervisor code for {n} parents)"
        )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument(
        "--port-every", type=int, default=2, help="every Kth parent has a port (0: none)"
    )
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    # Quiet: one line per applied child would drown the figures.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger("tests.fakes.apiserver").setLevel(logging.ERROR)
    trio.run(main, args)


if __name__ == "__main__":
    cli()
