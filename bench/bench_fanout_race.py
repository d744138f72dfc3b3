"""The three-way fan-out race on one real kube-apiserver: ours, client-go, kopf.

Run from the repository root (the assets of ../shared/realkube/build.sh, the peer of
../shared/peers/clientgo/build.sh, kopf from the ``test`` extra)::

    SUPERVISOR_TEST_KUBE_ASSETS=/tmp/realkube/bin python -m bench.bench_fanout_race \
        [--parents 1000] [--peer /tmp/cg/bin/clientgo-peer] [--edits 0] [--profile out.txt] \
        [--against /tmp/old-tree] [--only ours,client-go]

Each contender runs alone on the server, one after the other, as its own process with
its own ServiceAccount, at its default limits; the same parents are created by one
client while it watches (:func:`bench.bench_fanout_kopf.run`: the server set-up, the
audit log, /proc). Prints time to the last Deployment, requests and writes a parent,
CPU and RSS of each, and ours as ratios against client-go and kopf beside the aims.
The machine may be shared: the ratios, not the seconds, are the result; the load
average is printed. ``--against`` (repeatable) adds the daemon of another tree
(``git archive`` of an older commit unpacked there) as the contender "ours@<its
directory name>", run first, for an A/B of a change in the same run; ``--only``
leaves kopf out (ours and client-go are always run: the ratios are against client-go).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.bench_fanout_kopf import (
    AUDIT_POLICY,
    Audit,
    Result,
    cluster_admin,
    kopf_process,
    our_process,
    run,
)
from tests.realkube import Installation, RealKube, start_realkube

PEER = Path("/tmp/cg/bin/clientgo-peer")


@contextmanager
def clientgo_process(kube: RealKube, inst: Installation, tmp: Path,
                     binary: Path) -> Iterator[subprocess.Popen[bytes]]:
    cluster_admin(kube, inst, "clientgo")  # its own identity; the audit log tells it apart
    log = (tmp / f"clientgo-{inst.control}.log").open("wb")
    process = subprocess.Popen(
        [str(binary), "--namespace", inst.control, "--apps-namespace", inst.apps],
        env={**os.environ, "KUBECONFIG": str(inst.kubeconfig)}, stdout=log,
        stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def table(results: list[Result], n: int) -> str:
    lines = ["| figure | " + " | ".join(r.name for r in results) + " |",
             "| --- |" + " --- |" * len(results)]
    rows = [(f"time to the last of {n} Deployments (s)", lambda r: f"{r.children_s:.2f}"),
            ("  the client creating the parents (s)", lambda r: f"{r.created_s:.2f}"),
            ("  after the last parent was created (s)",
             lambda r: f"{r.children_s - r.created_s:.2f}"),
            ("requests a parent (Leases apart)", lambda r: f"{r.requests / n:.2f}"),
            ("writes a parent (Leases apart)", lambda r: f"{sum(r.writes.values()) / n:.2f}"),
            ("contender CPU (s)", lambda r: f"{r.cpu_s:.2f}"),
            ("API server + etcd CPU (s)", lambda r: f"{r.server_cpu_s:.2f}"),
            ("RSS after (MiB)", lambda r: f"{r.rss_mib:.0f}"),
            ("writes in 10 s idle (Leases apart)", lambda r: f"{r.idle_writes}")]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")
    by = {r.name: r for r in results}
    go, kopf = by["client-go"], by.get("kopf")
    for ours in results:
        name = ours.name
        if not name.startswith("ours"):
            continue
        aims = [("time / client-go's", ours.children_s / go.children_s, 1.1),
                ("CPU / client-go's", ours.cpu_s / go.cpu_s, 2.0),
                ("RSS / client-go's", ours.rss_mib / go.rss_mib, 2.0)]
        if kopf is not None:
            aims.append(("time / kopf's", ours.children_s / kopf.children_s, 0.75))
        lines += ["", f"| {name} | ratio | aim | met |", "| --- | --- | --- | --- |"]
        for label, ratio, aim in aims:
            met = "yes" if ratio <= aim else "NO"
            lines.append(f"| {label} | {ratio:.2f}x | <= {aim}x | {met} |")
    lines.append("")
    for r in results:
        lines.append(f"{r.name}: writes {dict(sorted(r.writes.items()))}; Lease writes "
                     f"{r.leases} during the bulk, {r.idle_leases} in 10 s idle")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument("--peer", type=Path, default=PEER)
    parser.add_argument("--edits", type=int, default=0, help="drift repairs of ours after")
    parser.add_argument("--profile", type=Path, default=None,
                        help="py-spy raw profile of ours during the bulk")
    parser.add_argument("--against", type=Path, action="append", default=[],
                        help="another tree whose daemon runs too, as 'ours@<directory>'")
    parser.add_argument("--only", default="ours,client-go,kopf",
                        help="contenders to run, comma-separated (kopf may be left out)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not args.peer.is_file():
        raise SystemExit(f"no client-go peer at {args.peer}: run "
                         "../shared/peers/clientgo/build.sh (its README)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-race-"))
    policy = tmp / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    with start_realkube(tmp, audit_policy=policy) as kube:
        kube.install_crds()
        audit = Audit(kube.run_dir / "audit.log")
        before = os.getloadavg()
        results = []
        for against in args.against:
            results.append(run(kube, audit, f"ours@{against.name}",
                               lambda inst, tree=against: our_process(inst, tmp, repo=tree),
                               args))
        results += [
            run(kube, audit, "ours", lambda inst: our_process(inst, tmp), args, args.profile),
            run(kube, audit, "client-go",
                lambda inst: clientgo_process(kube, inst, tmp, args.peer), args),
        ]
        if "kopf" in only:
            results.append(run(kube, audit, "kopf", lambda inst: kopf_process(kube, inst, tmp),
                               args))
        print(f"kube-apiserver v1.20.2, {args.parents} ServiceDefinitions, {os.cpu_count()} "
              f"CPUs (shared); load average {before[0]:.1f} before, "
              f"{os.getloadavg()[0]:.1f} after")
        print(table(results, args.parents))
        print(f"logs: {tmp}")


if __name__ == "__main__":
    main()
