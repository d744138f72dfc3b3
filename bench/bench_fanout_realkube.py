"""Fan-out at scale on a real kube-apiserver (v1.20.2, ../shared/realkube), from its audit log.

Run from the repository root (the assets built by ../shared/realkube/build.sh)::

    SUPERVISOR_TEST_KUBE_ASSETS=/tmp/realkube/bin python -m bench.bench_fanout_realkube \
        [--parents 1000] [--edits 100] [--workers 8] [--qps 200 --burst 400]

It starts etcd + kube-apiserver with an audit policy (every request at
``Metadata`` level), applies the CRDs and the project's manifests, and runs
the ServiceDefinition reconciler in this process on a ServiceAccount token
from the TokenRequest API (so the audit log tells its requests apart from the
setup's). Prints, side by side with the fan-out's aims:

- time from start to every Deployment applied, and to every parent Ready;
- requests per parent to converge (the ServiceAccount's audit events), by verb;
- writes of a resync when nothing changed (aim 0);
- drift repair latency p50/p99 over ``--edits`` hand edits (``replicas`` changed by
  the admin, one at a time; latency until the repair's apply returned; aim < 1 s).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
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
from tests.realkube import Installation, RealKube, start_realkube

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
"""
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def parent(inst: Installation, i: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": f"registry.example/app-{i}:1.0", "replicas": 1 + i % 3,
                            "env": {"INDEX": str(i)}}
    return {"apiVersion": "platform.trio-supervisor.dev/v1", "kind": "ServiceDefinition",
            "metadata": {"name": f"svc-{i:05d}", "namespace": inst.control}, "spec": spec}


def audit_events(kube: RealKube, user: str) -> list[dict[str, Any]]:
    path = kube.run_dir / "audit.log"
    out = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event.get("user", {}).get("username") == user and event.get("stage") == \
                "ResponseComplete":
            out.append(event)
    return out


def ready(obj: Any) -> bool:
    for cond in obj.status.conditions:
        if cond.type == "Ready":
            return bool(cond.status == "True"
                        and obj.status.observed_generation == obj.metadata.generation)
    return False


async def main(args: argparse.Namespace) -> None:
    n = args.parents
    tmp = Path(tempfile.mkdtemp(prefix="bench-realkube-"))
    policy = tmp / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    with start_realkube(tmp, audit_policy=policy) as kube:
        kube.install_crds()
        inst = kube.install()
        user = f"system:serviceaccount:{inst.control}:trio-supervisor"
        for i in range(n):
            kube.apply(parent(inst, i), manager="bench")
        config = KubernetesConfig(enabled=True, kubeconfig=str(inst.kubeconfig),
                                  control_namespace=inst.control, apps_namespace=inst.apps,
                                  qps=args.qps, burst=args.burst)
        tuning = FanoutTuning(watch=WatchTuning(), workers=args.workers, resync_s=3600.0)
        client = KubeClient.from_kubeconfig(config.kubeconfig, qps=config.qps,
                                            burst=config.burst)
        metrics = Metrics(process=False)
        reconciler = FanoutEngine(client, SERVICE_DEFINITION, config, metrics, FanoutStatus(),
                                tuning)
        print(f"kube-apiserver v1.20.2, {n} ServiceDefinitions, {args.workers} workers, "
              f"client rate limit {args.qps:g} qps / burst {args.burst}")
        async with trio.open_nursery() as nursery:
            before = len(audit_events(kube, user))
            start = time.perf_counter()
            await nursery.start(reconciler.run)
            applied_s = ready_s = None
            while ready_s is None:
                await trio.sleep(0.01)
                if applied_s is None and sum(1 for key, _ in reconciler.live.items()
                                             if key.plural == "deployments") >= n:
                    applied_s = time.perf_counter() - start
                if len(reconciler.parents) >= n and all(
                        ready(p) for p in reconciler.parents.values()):
                    ready_s = time.perf_counter() - start
            await reconciler.queue.wait_idle()
            await trio.sleep(1.0)  # the audit log backend writes as requests complete
            events = audit_events(kube, user)[before:]
            verbs = Counter(e["verb"] for e in events)
            print(f"all children applied: {applied_s:.2f} s; all parents Ready: {ready_s:.2f} s"
                  f" (aim: -)")
            print(f"requests to converge: {len(events)} = {len(events) / n:.2f} per parent "
                  f"(aim <= 2); by verb: {dict(sorted(verbs.items()))}")
            # Events (only failures by default; Applied with applied_events) are shown apart.
            reconcile = [e for e in events
                         if e.get("objectRef", {}).get("resource") != "events"]
            print(f"  without the Events: {len(reconcile)} = {len(reconcile) / n:.2f} per "
                  f"parent (aim <= 2)")
            writes = sum(v for k, v in verbs.items() if k in WRITE_VERBS)
            print(f"  of which writes: {writes / n:.2f} per parent "
                  f"(aim 2: Deployment create, status apply)")

            before = len(audit_events(kube, user))
            await reconciler.resync()
            await reconciler.queue.wait_idle()
            await trio.sleep(1.0)
            idle = [e for e in audit_events(kube, user)[before:] if e["verb"] in WRITE_VERBS]
            print(f"writes on an idle resync: {len(idle)} (aim 0)")

            latencies = []
            for i in range(min(args.edits, n)):
                name = f"svc-{i:05d}"
                repaired = metrics.registry.get_sample_value(
                    "supervisor_fanout_drift_repairs_total", {"kind": "ServiceDefinition"}) or 0
                path = f"/apis/apps/v1/namespaces/{inst.apps}/deployments/{name}"
                response = await trio.to_thread.run_sync(
                    kube.request, "PATCH", path, {"spec": {"replicas": 7}},
                    "application/merge-patch+json")
                response.raise_for_status()
                edited = time.perf_counter()
                while (metrics.registry.get_sample_value(
                        "supervisor_fanout_drift_repairs_total",
                        {"kind": "ServiceDefinition"}) or 0) <= repaired:
                    await trio.sleep(0.001)
                latencies.append(time.perf_counter() - edited)
            if latencies:
                latencies.sort()
                p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
                print(f"drift repair over {len(latencies)} hand edits: p50 "
                      f"{statistics.median(latencies) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
                      f"max {latencies[-1] * 1000:.0f} ms (aim < 1000 ms)")
            nursery.cancel_scope.cancel()
        await client.aclose()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--qps", type=float, default=KubernetesConfig().qps)
    parser.add_argument("--burst", type=int, default=KubernetesConfig().burst)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    trio.run(main, args)


if __name__ == "__main__":
    cli()
