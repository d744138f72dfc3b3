"""A real kube-apiserver + etcd for integration tests (envtest style), and what tests need of it.

The binaries come from ``SUPERVISOR_TEST_KUBE_ASSETS`` (a folder holding
``kube-apiserver`` and ``etcd``; ``.ci/run`` builds them with
``../shared/realkube/build.sh``); tests skip with that reason when it is unset, and
fail under ``SUPERVISOR_TEST_REQUIRE_ALL=1`` (tests/needs.py).
:func:`start_realkube` runs ``start.sh`` on free ports in a temporary folder
and stops both processes afterwards.

:class:`RealKube` talks to the server as the admin (``system:masters``) for the
tests' own setup and observations, and :meth:`RealKube.install` provisions one
isolated installation for a test: two fresh namespaces, and the project's own
``manifests/supervisor`` and ``manifests/apps-namespace`` (ServiceAccount,
Roles, RoleBindings) with their namespaces renamed and nothing else changed,
then a ServiceAccount token from the TokenRequest API in a kubeconfig. The
daemon runs on that token, so an RBAC rule missing from ``manifests/`` fails
the tests. The CRDs are applied once per server, without
``x-kubernetes-validations`` (kube-apiserver 1.20 has no CEL rules).
"""

from __future__ import annotations

import base64
import os
import signal
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

from tests import needs
from tests.polling import POLL_INTERVAL_S
from tests.proc import EXAMPLE, REPO, acli, free_port, write_config

ASSETS_ENV = "SUPERVISOR_TEST_KUBE_ASSETS"
START = Path(os.environ.get("SUPERVISOR_REALKUBE_DIR", REPO.parent / "shared" / "realkube")) \
    / "start.sh"
MANIFESTS = REPO / "manifests"
CRD_PATHS = {
    "servicedefinitions": "/apis/platform.trio-supervisor.dev/v1",
    "workflows": "/apis/platform.trio-supervisor.dev/v1",
}

Obj = dict[str, Any]

# What a test namespace can hold here (no controllers make anything else): the
# children, the daemon's RBAC from manifests/apps-namespace, Events.
NAMESPACED: tuple[tuple[str, str], ...] = (
    ("/apis/apps/v1", "deployments"),
    ("/api/v1", "services"),
    ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    ("/api/v1", "events"),
    ("/api/v1", "configmaps"),
    ("/api/v1", "serviceaccounts"),
    ("/api/v1", "secrets"),
)


def assets_or_skip() -> Path:
    value = os.environ.get(ASSETS_ENV, "")
    if not value:
        needs.missing("kube-apiserver and etcd",
                      f"set {ASSETS_ENV} to a folder holding them; "
                      "../shared/realkube/build.sh builds them, as .ci/run does")
    path = Path(value)
    for binary in ("kube-apiserver", "etcd"):
        if not (path / binary).is_file():
            pytest.fail(f"{ASSETS_ENV}={value} holds no {binary}")
    if not START.is_file():
        pytest.fail(f"{START} not found (set SUPERVISOR_REALKUBE_DIR to ../shared/realkube)")
    return path


def _object_path(obj: Obj) -> str:
    kind = obj["kind"]
    name = obj["metadata"]["name"]
    ns = obj["metadata"].get("namespace")
    paths = {
        "Namespace": f"/api/v1/namespaces/{name}",
        "ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts/{name}",
        "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}",
        "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}",
        "ClusterRole": f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
        "ClusterRoleBinding": f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
        "ServiceDefinition":
            f"/apis/platform.trio-supervisor.dev/v1/namespaces/{ns}/servicedefinitions/{name}",
        "Deployment": f"/apis/apps/v1/namespaces/{ns}/deployments/{name}",
        "Service": f"/api/v1/namespaces/{ns}/services/{name}",
        "CustomResourceDefinition":
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
    }
    return paths[kind]


def _strip_cel(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_cel(v) for k, v in value.items() if k != "x-kubernetes-validations"}
    if isinstance(value, list):
        return [_strip_cel(v) for v in value]
    return value


def manifest_objects(folder: str) -> list[Obj]:
    """The objects of ``manifests/<folder>`` (its kustomization's resources, in order)."""
    base = MANIFESTS / folder
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    out: list[Obj] = []
    for resource in kustomization["resources"]:
        out += [doc for doc in yaml.safe_load_all((base / resource).read_text()) if doc]
    return out


def _rename(obj: Obj, names: dict[str, str]) -> Obj:
    """``obj`` with the manifests' namespaces replaced by this test's (nothing else)."""
    obj = yaml.safe_load(yaml.safe_dump(obj))
    md = obj["metadata"]
    if obj["kind"] == "Namespace":
        md["name"] = names.get(md["name"], md["name"])
    if "namespace" in md:
        md["namespace"] = names.get(md["namespace"], md["namespace"])
    for subject in obj.get("subjects") or []:
        if "namespace" in subject:
            subject["namespace"] = names.get(subject["namespace"], subject["namespace"])
    return obj



def wait_blocking(check: Callable[[], bool], tries: int, failure: str) -> None:
    """Poll ``check`` (outside state: a real server or process, which sends no event)."""
    for _ in range(tries):
        if check():
            return
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(failure)

@dataclass
class Installation:
    """One test's namespaces and the daemon's kubeconfig (a ServiceAccount token)."""

    control: str
    apps: str
    kubeconfig: Path

    def toml(self, **extra: Any) -> str:
        lines = ["[kubernetes]", "enabled = true", f'kubeconfig = "{self.kubeconfig}"',
                 f'control_namespace = "{self.control}"', f'apps_namespace = "{self.apps}"']
        for key, value in {"preflight_retry_s": 2, **extra}.items():
            lines.append(f"{key} = {value!r}" if not isinstance(value, str)
                         else f'{key} = "{value}"')
        return "\n" + "\n".join(lines) + "\n"


class RealKube:
    """A running kube-apiserver; ``admin`` is an httpx client with the admin token."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir = run_dir
        self.url = env["K8S_API"]
        self.ca = env["K8S_CA"]
        self.admin_token = env["K8S_ADMIN_TOKEN"]
        self.pids = [int(env["APISERVER_PID"]), int(env["ETCD_PID"])]
        self.admin = httpx.Client(base_url=self.url, timeout=30,
                                  verify=ssl.create_default_context(cafile=self.ca),
                                  headers={"Authorization": f"Bearer {self.admin_token}"})
        self.crds_installed = False
        self._apiserver: subprocess.Popen[bytes] | None = None  # after a restart: ours

    # -- plain admin requests (setup and observation) ---------------------------------

    def apply(self, obj: Obj, *, manager: str = "tests") -> Obj:
        response = self.admin.patch(
            _object_path(obj), params={"fieldManager": manager, "force": "true"},
            content=yaml.safe_dump(obj).encode(),
            headers={"Content-Type": "application/apply-patch+yaml"})
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    def get(self, path: str) -> Obj | None:
        response = self.admin.get(path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> httpx.Response:
        return self.admin.request(method, path, json=body,
                                  headers={"Content-Type": content_type})

    def install_crds(self) -> None:
        """Apply ``manifests/crds`` (CEL rules stripped) and wait until they are served."""
        for crd in manifest_objects("crds"):
            self.apply(_strip_cel(crd))
        for plural, group_version in CRD_PATHS.items():

            def served(plural: str = plural, group_version: str = group_version) -> bool:
                found = self.get(group_version) or {}
                return any(r["name"] == plural for r in found.get("resources", []))

            wait_blocking(served, 300, f"CRD {plural} never served")
        self.crds_installed = True

    def install(self) -> Installation:
        """Fresh namespaces with the project's manifests, and a TokenRequest kubeconfig."""
        suffix = uuid.uuid4().hex[:6]
        names = {"trio-supervisor": f"ts-{suffix}", "apps": f"apps-{suffix}"}
        for folder in ("supervisor", "apps-namespace"):
            for obj in manifest_objects(folder):
                self.apply(_rename(obj, names))
        control = names["trio-supervisor"]
        response = self.request(
            "POST", f"/api/v1/namespaces/{control}/serviceaccounts/trio-supervisor/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": 3600}})
        response.raise_for_status()
        token = response.json()["status"]["token"]
        ca_data = base64.b64encode(Path(self.ca).read_bytes()).decode()
        kubeconfig = self.run_dir / f"kubeconfig-{suffix}"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "real", "cluster": {
                "server": self.url, "certificate-authority-data": ca_data}}],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "real", "user": "sa"}}],
            "current-context": "sa",
        }))
        return Installation(control, names["apps"], kubeconfig)

    def install_apps_namespace(self, inst: Installation) -> None:
        """Apply ``manifests/apps-namespace`` (the namespace, the daemon's Role and
        RoleBinding in it) for ``inst`` again, as an operator re-creating it would."""
        names = {"trio-supervisor": inst.control, "apps": inst.apps}
        for obj in manifest_objects("apps-namespace"):
            self.apply(_rename(obj, names))

    def delete_namespace_content(self, namespace: str,
                                 kinds: tuple[tuple[str, str], ...] = NAMESPACED) -> None:
        """Delete every object of ``kinds`` (API path, plural) in ``namespace``: the first
        half of what the namespace controller (not run here) does for a Terminating one."""
        for api, plural in kinds:
            found = self.get(f"{api}/namespaces/{namespace}/{plural}")
            for item in (found or {}).get("items", []):
                path = f"{api}/namespaces/{namespace}/{plural}/{item['metadata']['name']}"
                response = self.admin.delete(path)
                if response.status_code != 404:
                    response.raise_for_status()

    def finalize_namespace(self, namespace: str) -> None:
        """The second half: drop the ``kubernetes`` finalizer through ``/finalize``; a
        Terminating namespace is then removed."""
        ns = self.get(f"/api/v1/namespaces/{namespace}")
        if ns is None:
            return
        ns["spec"]["finalizers"] = []
        response = self.request("PUT", f"/api/v1/namespaces/{namespace}/finalize", ns)
        response.raise_for_status()

    def restart_apiserver(self) -> None:
        """Kill kube-apiserver and start it again with the same arguments and etcd.

        Its watch cache starts over at etcd's current revision, so a client
        watching from an older resourceVersion gets ``410 Gone`` and must relist.
        """
        pid = self.pids[0]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        # SIGKILL: a crash. (SIGTERM makes 1.20 wait out its in-flight requests first.)
        os.kill(pid, signal.SIGKILL)
        old = self._apiserver

        def gone() -> bool:  # the old process releasing its port
            return old.poll() is not None if old is not None else not Path(f"/proc/{pid}").exists()

        wait_blocking(gone, 600, "the killed kube-apiserver did not exit")
        log = (self.run_dir / "apiserver.log").open("ab")
        self._apiserver = subprocess.Popen(argv, cwd=self.run_dir, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.pids[0] = self._apiserver.pid
        def ready() -> bool:
            with suppress(httpx.HTTPError):
                return self.admin.get("/readyz").status_code == 200
            return False

        wait_blocking(ready, 1500, "kube-apiserver did not come back")

    def stop(self) -> None:
        self.admin.close()
        for pid in self.pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if self._apiserver is not None:
            with suppress(subprocess.TimeoutExpired):
                self._apiserver.wait(timeout=10)


@contextmanager
def start_realkube(tmp: Path, audit_policy: Path | None = None) -> Iterator[RealKube]:
    """Start etcd + kube-apiserver on free ports under ``tmp``; stop both afterwards."""
    assets = assets_or_skip()
    for tool in ("openssl", "curl"):
        needs.program(tool, f"apt-get install {tool}; {START.name} uses it")
    run_dir = tmp / "realkube"
    env = {**os.environ, "BIN": str(assets), "ETCD_PORT": str(free_port()),
           "ETCD_PEER_PORT": str(free_port()), "APISERVER_PORT": str(free_port())}
    if audit_policy is not None:
        env["AUDIT_POLICY"] = str(audit_policy)
    result = subprocess.run(["bash", str(START), str(run_dir)], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    values: dict[str, str] = {}
    for line in (run_dir / "env.sh").read_text().splitlines() if (
            run_dir / "env.sh").exists() else []:
        key, _, value = line.removeprefix("export ").partition("=")
        values[key] = value
    if result.returncode != 0 or "K8S_API" not in values:
        for pid_file in ("apiserver.pid", "etcd.pid"):
            with suppress(OSError, ValueError, ProcessLookupError):
                os.kill(int((run_dir / pid_file).read_text()), signal.SIGTERM)
        raise AssertionError(f"start.sh failed ({result.returncode}):\n{result.stdout}\n"
                             f"{result.stderr}")
    kube = RealKube(run_dir, values)
    try:
        yield kube
    finally:
        kube.stop()


GROUP = "platform.trio-supervisor.dev/v1"


def sd(inst: Installation, name: str, *, image: str = "nginx:1.27", port: int | None = None,
       replicas: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": image, "replicas": replicas}
    if port is not None:
        spec["port"] = port
    return {"apiVersion": GROUP, "kind": "ServiceDefinition",
            "metadata": {"name": name, "namespace": inst.control}, "spec": spec}


async def aget(kube: RealKube, path: str) -> dict[str, Any] | None:
    return await trio.to_thread.run_sync(kube.get, path)


def deployment_path(inst: Installation, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{inst.apps}/deployments/{name}"


def parent_path(inst: Installation, name: str) -> str:
    return f"/apis/platform.trio-supervisor.dev/v1/namespaces/{inst.control}/servicedefinitions/{name}"


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return cond  # type: ignore[no-any-return]
    return {}




async def daemon_config(tmp_path: Path, inst: Installation, port: int, **extra: Any) -> Path:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db", inst.toml(**extra),
                          port=port)
    await acli("publish", "--config", str(config), str(EXAMPLE))
    return config


async def aget_ready(kube: RealKube, inst: Installation, name: str) -> bool:
    return condition(await aget(kube, parent_path(inst, name)), "Ready").get("status") == "True"


async def gone(kube: RealKube, path: str) -> bool:
    return await aget(kube, path) is None
