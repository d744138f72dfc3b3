"""Fan-out handover between two real daemon replicas on the fake API server.

Run from the repository root::

    python -m bench.bench_handover [--kills 20] [--sigterms 20] [--parents 20]
        [--lease 15 --renew 10 --retry 2] [--idle-s 30]

Each round starts replica A, waits until it leads (the Lease was released by the
previous round, so that takes at most a retry period), starts replica B and waits
until B has observed A, waits a random fraction of a retry period (so the signal
falls at a random phase of B's polling), then stops A: ``SIGKILL`` (a crash: B must wait for the
lease to expire, as observed by its own clock) or ``SIGTERM`` (A releases the
Lease on its way out: B takes over at its next retry). The handover is the time
from the signal to B's ``fan-out leadership acquired`` log line (both processes
log on one host clock). B is then stopped with SIGTERM, releasing the Lease.

Prints p50/p99/max for each way, as ratios against the protocol's floors measured
in this run with these timings:

- kill: ``lease_duration_s`` (the least any standby must wait) and the bound
  ``lease_duration_s + retry_period_s``;
- SIGTERM: ``retry_period_s`` (the bound), and the round trip of one Lease
  read + write measured against the same server (the least a handover can take).

And the API requests per second the election costs while idle (both replicas
running, nothing to fan out), counted by the fake per replica.
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import trio

from supervisor.kube.client import KubeClient
from supervisor.kube.lease import KubeLeases, LeaseRecord
from tests.fakes.apiserver import FakeApiServer, run_fake_apiserver, write_kubeconfig
from tests.ha import CONTROL, Timings, lease_writes, log_time, replica, sd
from tests.proc import EXAMPLE, acli, run_daemon

PHASE = random.Random(14)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def round_trip_floor(server: FakeApiServer, kubeconfig: Path, n: int = 50) -> float:
    """Median time of one Lease get + update on a warm connection, against this server."""
    client = KubeClient.from_kubeconfig(str(kubeconfig))
    leases = KubeLeases(client, CONTROL, "bench-floor", "bench")
    try:
        await leases.create(LeaseRecord(holder="bench", duration_s=15))
        times = []
        for _ in range(n):
            start = time.perf_counter()
            current = await leases.get()
            assert current is not None
            await leases.update(replace(current, holder="bench"))
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        await client.aclose()


async def one_round(tmp: Path, server: FakeApiServer, kubeconfig: Path, cp: str,
                    timings: Timings, how: signal.Signals, n: int) -> tuple[float, float]:
    """(signal -> B acquired, A's release -> B acquired; 0 when killed)."""
    a = replica(tmp, f"a{n}", kubeconfig, cp, timings)
    b = replica(tmp, f"b{n}", kubeconfig, cp, timings)
    async with run_daemon(a.config) as da:
        await da.wait_log("fan-out leadership acquired")
        async with run_daemon(b.config) as db:
            await db.wait_log("fan-out leader observed", holder=a.identity)
            # At a random phase of the standby's polling (right after its poll would
            # be the worst case for a SIGTERM handover, a whole retry period).
            await trio.sleep(PHASE.uniform(0, timings.retry_period_s))
            da.signal(how)
            signalled = time.time()
            took = await db.wait_log("fan-out leadership acquired")
            await da.wait()
            released = 0.0
            if how == signal.SIGTERM:
                released = log_time(took) - log_time(await da.wait_log("fan-out lease released"))
            db.signal(signal.SIGTERM)
            await db.wait_log("fan-out lease released")
            await db.wait()
    return log_time(took) - signalled, released


async def idle_rate(tmp: Path, server: FakeApiServer, kubeconfig: Path, cp: str,
                    timings: Timings, seconds: float) -> tuple[float, float]:
    a = replica(tmp, "idle-a", kubeconfig, cp, timings)
    b = replica(tmp, "idle-b", kubeconfig, cp, timings)
    async with run_daemon(a.config) as da:
        await da.wait_log("fan-out leadership acquired")
        async with run_daemon(b.config) as db:
            await db.wait_log("fan-out leader observed", holder=a.identity)
            await trio.sleep(timings.retry_period_s * 2)  # past start-up
            start = len(server.requests)
            await trio.sleep(seconds)
            window = server.requests[start:]
            lease = [r for r in window if "/leases" in r.path]
            leader = [r for r in lease if r.method != "GET" and r.field_manager == a.identity]
            standby_writes = [r for r in lease if r.field_manager == b.identity]
            assert not standby_writes, "the standby wrote the Lease while idle"
            # Reads carry no field manager: the leader reads once per renewal.
            rate_leader = 2 * len(leader) / seconds
            rate_all = len(lease) / seconds
            da.signal(signal.SIGTERM)
            await da.wait()
            db.signal(signal.SIGTERM)
            await db.wait()
    return rate_leader, rate_all


async def main(args: argparse.Namespace) -> None:
    timings = Timings(args.lease, args.renew, args.retry)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        async with run_fake_apiserver(bookmark_interval_s=1.0) as server:
            kubeconfig = tmp / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            cp = f"sqlite:///{tmp}/cp.db"
            first = replica(tmp, "publisher", kubeconfig, cp, timings)
            await acli("publish", "--config", str(first.config), str(EXAMPLE))
            for i in range(args.parents):
                server.create(sd(f"bench-{i}"))
            floor = await round_trip_floor(server, kubeconfig)
            kills: list[float] = []
            terms: list[float] = []
            after_release: list[float] = []
            for n in range(max(args.kills, args.sigterms)):
                if n < args.sigterms:
                    term, released = await one_round(tmp, server, kubeconfig, cp, timings,
                                                     signal.SIGTERM, 2 * n)
                    terms.append(term)
                    after_release.append(released)
                if n < args.kills:
                    kill, _ = await one_round(tmp, server, kubeconfig, cp, timings,
                                              signal.SIGKILL, 2 * n + 1)
                    kills.append(kill)
                print(f"  round {n + 1}: sigterm {terms[-1] if terms else 0:.3f} s, "
                      f"kill {kills[-1] if kills else 0:.3f} s", flush=True)
            leader_rps, all_rps = await idle_rate(tmp, server, kubeconfig, cp, timings,
                                                  args.idle_s)
            written = len(lease_writes(server, "replica-idle-a"))
    t = timings
    print(f"timings: lease_duration_s={t.lease_duration_s:g} renew_deadline_s="
          f"{t.renew_deadline_s:g} retry_period_s={t.retry_period_s:g}; "
          f"{args.parents} parents")
    print(f"floor: one Lease get+update round trip {floor * 1000:.1f} ms (median of 50)")
    if terms:
        p50, p99 = statistics.median(terms), pct(terms, 0.99)
        print(f"SIGTERM handover over {len(terms)}: p50 {p50:.3f} s, p99 {p99:.3f} s, "
              f"max {max(terms):.3f} s = p50 {p50 / t.retry_period_s:.2f}x / p99 "
              f"{p99 / t.retry_period_s:.2f}x the retry period (bound 1x); p50 "
              f"{p50 / floor:.0f}x the round-trip floor")
        r50, r99 = statistics.median(after_release), pct(after_release, 0.99)
        print(f"  of which release -> acquired: p50 {r50:.3f} s, p99 {r99:.3f} s = "
              f"{r50 / t.retry_period_s:.2f}x / {r99 / t.retry_period_s:.2f}x the retry period")
    if kills:
        p50, p99 = statistics.median(kills), pct(kills, 0.99)
        bound = t.lease_duration_s + t.retry_period_s
        print(f"kill -9 handover over {len(kills)}: p50 {p50:.3f} s, p99 {p99:.3f} s, "
              f"max {max(kills):.3f} s = p50 {p50 / t.lease_duration_s:.2f}x / p99 "
              f"{p99 / t.lease_duration_s:.2f}x the lease duration (floor 1x); p99 "
              f"{p99 / bound:.2f}x lease + retry (bound 1x)")
    print(f"idle: {all_rps:.2f} Lease requests/s for both replicas ({leader_rps:.2f}/s the "
          f"leader's renewals, get + update; {2 / t.retry_period_s:.2f}/s expected); "
          f"{written} leader writes in total")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--sigterms", type=int, default=20)
    parser.add_argument("--parents", type=int, default=20)
    parser.add_argument("--lease", type=float, default=15.0)
    parser.add_argument("--renew", type=float, default=10.0)
    parser.add_argument("--retry", type=float, default=2.0)
    parser.add_argument("--idle-s", type=float, default=30.0)
    trio.run(main, parser.parse_args())
