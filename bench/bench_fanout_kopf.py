"""The fan-out beside kopf, one after the other on one real kube-apiserver (../shared/realkube).

Run from the repository root, with kopf installed (the ``test`` extra has it)::

    SUPERVISOR_TEST_KUBE_ASSETS=/tmp/realkube/bin python -m bench.bench_fanout_kopf \
        [--parents 1000] [--rounds 1] [--edits 100] [--profile out.txt]

Starts etcd + kube-apiserver with an audit log (every request at ``Metadata``
level), applies the CRDs, then runs each contender alone, in its own fresh pair
of namespaces, as its own process:

- **kopf**: a ten-line operator (:data:`KOPF_OPERATOR`) doing what our
  ServiceDefinition does for a parent without a port: a Deployment per parent,
  and the handler's result in the parent's status (Events posting off, as ours);
- **ours**: the daemon (``python -m supervisor``) with its defaults (drift
  repair, leader election on a Lease), and again with the client-side limiter
  out of the way (``qps``/``burst`` 1e6), to show whether the limiter sets the pace.

Each gets ``--parents`` ServiceDefinitions created by one client while it
watches. From the audit log (the contender's own ServiceAccount): time from
the first parent created to the last Deployment created, and writes per parent
by verb and resource (Lease renewals apart); from /proc: CPU (user + system)
of the contender and of kube-apiserver + etcd over the bulk, and the
contender's RSS afterwards. Then 10 s idle (its writes, Leases apart) and, for
ours, drift repair: ``--edits`` Deployments' replicas changed by hand, the
latency until its repair write (from the audit log). The machine may be
shared: compare the contenders of one run, as ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.proc import EXAMPLE, REPO, cli, free_port, write_config
from tests.realkube import Installation, RealKube, start_realkube

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
"""
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
GROUP = "platform.trio-supervisor.dev"
TICKS = os.sysconf("SC_CLK_TCK")

KOPF_OPERATOR = '''
import kopf, kubernetes

@kopf.on.startup()
def configure(settings, **_):
    settings.posting.enabled = False  # no Events, as ours by default
    kubernetes.config.load_kube_config()

@kopf.on.create("platform.trio-supervisor.dev", "v1", "servicedefinitions")
def create(spec, name, **_):
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "kopf"}
    container = {"name": "main", "image": spec["image"],
                 "env": [{"name": k, "value": v} for k, v in sorted(spec.get("env", {}).items())]}
    kubernetes.client.AppsV1Api().create_namespaced_deployment(APPS, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": spec.get("replicas", 1), "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [container]}}}})
    return {"applied": 1}
'''


def parent(inst: Installation, i: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": f"registry.example/app-{i}:1.0", "replicas": 1 + i % 3,
                            "env": {"INDEX": str(i)}}
    return {"apiVersion": f"{GROUP}/v1", "kind": "ServiceDefinition",
            "metadata": {"name": f"svc-{i:05d}", "namespace": inst.control}, "spec": spec}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stamp(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()


class Audit:
    """The audit log read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self._offset += end
            for line in data[:end].splitlines():
                event = json.loads(line)
                # A watch is logged when it starts (and again when it ends).
                if event.get("stage") in ("ResponseComplete", "ResponseStarted"):
                    self.events.append(event)
        return self.events

    def of(self, user: str, since: float = 0.0) -> list[dict[str, Any]]:
        return [e for e in self.read() if e.get("user", {}).get("username") == user
                and stamp(e) >= since]


def resource(event: dict[str, Any]) -> str:
    ref = event.get("objectRef", {})
    sub = ref.get("subresource")
    return f"{ref.get('resource')}/{sub}" if sub else str(ref.get("resource"))


@dataclass
class Result:
    name: str
    children_s: float = 0.0
    created_s: float = 0.0  # the bench creating the parents: the floor of children_s
    writes: Counter[str] = field(default_factory=Counter)
    requests: int = 0  # Leases apart, watches counted when they start
    leases: int = 0
    cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    rss_mib: float = 0.0
    idle_writes: int = 0
    idle_leases: int = 0
    repairs_ms: list[float] = field(default_factory=list)


def user_of(inst: Installation) -> str:
    return f"system:serviceaccount:{inst.control}:trio-supervisor"


def cluster_admin(kube: RealKube, inst: Installation, name: str) -> None:
    """The installation's ServiceAccount made cluster-admin (a peer needing more than our Role)."""
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{name}-{inst.control}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "trio-supervisor",
                              "namespace": inst.control}]})


@contextmanager
def kopf_process(kube: RealKube, inst: Installation,
                 tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    # kopf patches the parent itself (its progress annotation): more than our Role allows.
    cluster_admin(kube, inst, "kopf")
    operator = tmp / f"operator-{inst.control}.py"
    operator.write_text(f"APPS = {inst.apps!r}\n" + textwrap.dedent(KOPF_OPERATOR))
    env = {**os.environ, "KUBECONFIG": str(inst.kubeconfig)}
    log = (tmp / f"kopf-{inst.control}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", inst.control,
         "--quiet", str(operator)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def our_process(inst: Installation, tmp: Path, repo: Path = REPO,
                **kube: Any) -> Iterator[subprocess.Popen[bytes]]:
    """The daemon of the tree at ``repo`` (this one by default: another commit's for an A/B)."""
    directory = tmp / f"ours-{inst.control}"
    directory.mkdir()
    config = write_config(directory, f"sqlite:///{directory}/cp.db",
                          inst.toml(resync_s=3600, **kube), port=free_port())
    text = config.read_text().replace('level = "info"', 'level = "warning"')
    config.write_text(text)
    cli("publish", "--config", str(config), str(EXAMPLE))
    log = (directory / "daemon.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "supervisor", "--config", str(config)],
                               stdout=subprocess.DEVNULL, stderr=log, cwd=repo,
                               env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def run(kube: RealKube, audit: Audit, name: str, start: Callable[[Installation], Any],
        args: argparse.Namespace, profile: Path | None = None) -> Result:
    n = args.parents
    inst = kube.install()
    user = user_of(inst)
    result = Result(name)
    with start(inst) as process:
        # Its watch is logged once the server sends something on it: its list is the sign.
        wait(lambda: any(e["verb"] == "list" and resource(e) == "servicedefinitions"
                         for e in audit.of(user)), 60, f"{name} to list the parents")
        time.sleep(3.0)
        pids = kube.pids
        cpu0, server0 = cpu_s(process.pid), sum(cpu_s(p) for p in pids)
        spy = None
        if profile is not None:
            spy = subprocess.Popen(["py-spy", "record", "--format", "raw", "-o", str(profile),
                                    "-p", str(process.pid), "-d", "60", "-r", "50"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        began = time.time()
        for i in range(n):
            kube.request("POST", f"/apis/{GROUP}/v1/namespaces/{inst.control}/"
                         "servicedefinitions", parent(inst, i)).raise_for_status()
        result.created_s = time.time() - began

        def creates() -> dict[str, float]:
            """Each Deployment's first write that created it (a create, or a server-side
            apply answering 201), by name."""
            first: dict[str, float] = {}
            for e in audit.of(user, began):
                if (e["verb"] in ("create", "patch") and resource(e) == "deployments"
                        and e.get("responseStatus", {}).get("code") == 201):
                    first.setdefault(e.get("objectRef", {}).get("name", ""), stamp(e))
            return first

        wait(lambda: len(creates()) >= n, 600, f"{name}'s {n} Deployments")
        result.children_s = max(creates().values()) - began

        def last_write() -> float:
            writes = [stamp(e) for e in audit.of(user, began)
                      if e["verb"] in WRITE_VERBS and resource(e) != "leases"]
            return max(writes) if writes else began

        wait(lambda: time.time() - last_write() > 3.0, 600, f"{name} to finish its writes")
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        result.cpu_s = cpu_s(process.pid) - cpu0
        result.server_cpu_s = sum(cpu_s(p) for p in pids) - server0
        result.rss_mib = rss_mib(process.pid)
        for e in audit.of(user, began):
            if resource(e) != "leases":
                result.requests += 1
            if e["verb"] in WRITE_VERBS:
                if resource(e) == "leases":
                    result.leases += 1
                else:
                    result.writes[f"{e['verb']} {resource(e)}"] += 1
        quiet = time.time()
        time.sleep(10.0)
        idle = [e for e in audit.of(user, quiet) if e["verb"] in WRITE_VERBS]
        result.idle_leases = sum(1 for e in idle if resource(e) == "leases")
        result.idle_writes = len(idle) - result.idle_leases
        if name.startswith("ours") and args.edits:
            result.repairs_ms = drift_repairs(kube, audit, inst, args.edits)
    return result


def drift_repairs(kube: RealKube, audit: Audit, inst: Installation, edits: int) -> list[float]:
    """Latency from each hand edit of a Deployment's replicas to our repair write, in ms."""
    edited: dict[str, float] = {}
    for i in range(edits):
        name = f"svc-{i:05d}"
        path = f"/apis/apps/v1/namespaces/{inst.apps}/deployments/{name}"
        kube.request("PATCH", path, {"spec": {"replicas": 7}},
                     "application/merge-patch+json").raise_for_status()
        edited[name] = time.time()
        time.sleep(0.05)
    time.sleep(3.0)
    user = user_of(inst)
    latencies = []
    for name, at in edited.items():
        admin = [stamp(e) for e in audit.read() if e["verb"] == "patch"
                 and e.get("objectRef", {}).get("name") == name
                 and resource(e) == "deployments"
                 and e.get("user", {}).get("username") != user and stamp(e) >= at - 1.0]
        ours = [stamp(e) for e in audit.of(user, at - 1.0) if e["verb"] == "patch"
                and e.get("objectRef", {}).get("name") == name and resource(e) == "deployments"]
        if admin and ours:
            after = [t for t in ours if t >= admin[0]]
            latencies.append(((min(after) if after else 60.0) - admin[0]) * 1000)
    return sorted(latencies)


def table(results: list[Result], n: int) -> str:
    kopf = next(r for r in results if r.name == "kopf")
    lines = ["| figure | " + " | ".join(r.name for r in results) + " |",
             "| --- |" + " --- |" * len(results)]

    def row(label: str, value: Callable[[Result], float], fmt: str,
            ratio: bool = True) -> None:
        cells = []
        for r in results:
            text = format(value(r), fmt)
            if ratio and r is not kopf and value(kopf):
                text += f" ({value(r) / value(kopf):.2f}x)"
            cells.append(text)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row(f"time to all {n} Deployments (s)", lambda r: r.children_s, ".2f")
    row(f"  the bench creating the {n} parents (the floor)", lambda r: r.created_s, ".2f",
        ratio=False)
    row("writes a parent (Leases apart)", lambda r: sum(r.writes.values()) / n, ".2f")
    row("contender CPU (s)", lambda r: r.cpu_s, ".2f")
    row("API server + etcd CPU (s)", lambda r: r.server_cpu_s, ".2f")
    row("RSS after (MiB)", lambda r: r.rss_mib, ".0f")
    row("writes in 10 s idle (Leases apart)", lambda r: r.idle_writes, "d", ratio=False)
    lines.append("")
    for r in results:
        lines.append(f"{r.name}: writes {dict(sorted(r.writes.items()))}; Lease writes "
                     f"{r.leases} during the bulk, {r.idle_leases} in 10 s idle")
        if r.repairs_ms:
            p99 = r.repairs_ms[min(len(r.repairs_ms) - 1, int(len(r.repairs_ms) * 0.99))]
            lines.append(f"  drift repair over {len(r.repairs_ms)} hand edits: p50 "
                         f"{statistics.median(r.repairs_ms):.0f} ms, p99 {p99:.0f} ms")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--edits", type=int, default=100)
    parser.add_argument("--profile", type=Path, default=None,
                        help="py-spy raw profile of ours (defaults) during the bulk")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-kopf-"))
    policy = tmp / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    with start_realkube(tmp, audit_policy=policy) as kube:
        kube.install_crds()
        audit = Audit(kube.run_dir / "audit.log")
        print(f"kube-apiserver v1.20.2, {args.parents} ServiceDefinitions, {os.cpu_count()} "
              f"CPUs (possibly shared), {args.rounds} round(s)")
        for round_ in range(args.rounds):
            results = [
                run(kube, audit, "kopf", lambda inst: kopf_process(kube, inst, tmp), args),
                run(kube, audit, "ours", lambda inst: our_process(inst, tmp), args,
                    args.profile if round_ == 0 else None),
                run(kube, audit, "ours, no client limit",
                    lambda inst: our_process(inst, tmp, qps=1e6, burst=1000000), args),
            ]
            print(f"\nround {round_ + 1}")
            print(table(results, args.parents))
    yaml.safe_dump({"tmp": str(tmp)}, sys.stdout)


if __name__ == "__main__":
    main()
