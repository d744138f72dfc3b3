"""The fan-out in the real daemon process: its Kubernetes config and a ServiceDefinition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.proc import write_config

GROUP = "platform.trio-supervisor.dev/v1"


def sd(name: str, port: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": "nginx:1.27", "replicas": 2}
    if port is not None:
        spec["port"] = port
    return {"apiVersion": GROUP, "kind": "ServiceDefinition",
            "metadata": {"name": name, "namespace": "trio-supervisor"}, "spec": spec}


def kube_config(tmp_path: Path, kubeconfig: Path, admin_port: int, *,
                leader_election: bool = True) -> Path:
    extra = (f'\n[kubernetes]\nenabled = true\nkubeconfig = "{kubeconfig}"\n'
             'control_namespace = "trio-supervisor"\napps_namespace = "apps"\n'
             "preflight_retry_s = 1\n"
             f"leader_election = {'true' if leader_election else 'false'}\n")
    return write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", extra, port=admin_port)
