"""The deploy steps of docs/operations.md work as written.

- Kubernetes, first block: run for real in a copy of the repository's
  ``deploy/kubernetes/prod.toml`` (keygen, the ``sed`` that replaces the
  trusted-keys placeholder, the token, ``check``), with this tree's
  ``trio-supervisor`` on PATH;
- Kubernetes, second block: replayed command by command against the rendered
  manifests: every namespace a command writes into exists by then, every Secret
  the StatefulSet mounts was created before it, with the keys it reads;
- the placeholder as shipped is refused (exit 2), so a pod never runs with it;
- containers: the key and token files the configuration names are installed
  owned by the image's user before ``docker run`` mounts them;
- docs/operations.md says why there is no PodDisruptionBudget (there is none).
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import containerfile_stages, kustomize
from tests.proc import REPO, cli

OPERATIONS = (REPO / "docs" / "operations.md").read_text()
PROD = REPO / "deploy" / "kubernetes" / "prod.toml"


def literal_blocks(section: str) -> list[list[str]]:
    """The indented code blocks of a docs/operations.md section (continuation lines joined)."""
    body = OPERATIONS.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks: list[list[str]] = []
    block: list[str] | None = None
    blank = True
    for line in body.splitlines():
        if line.startswith("    ") and (block is not None or blank):
            if block is None:
                block = []
                blocks.append(block)
            block.append(line[4:])
        elif line.strip():
            block = None
        blank = not line.strip()
    joined_blocks: list[list[str]] = []
    for lines in blocks:
        joined: list[str] = []
        for line in lines:
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line.strip()
            else:
                joined.append(line)
        joined_blocks.append(joined)
    return joined_blocks


def test_the_shipped_placeholder_is_refused_with_a_hint() -> None:
    result = cli("check", "--config", str(PROD), check=False)
    assert result.returncode == 2
    assert "$.cache.trusted_keys[0]: still the placeholder" in result.stderr
    assert "trio-supervisor keygen" in result.stderr


def test_kubernetes_workstation_steps_run_as_written(tmp_path: Path) -> None:
    workstation, _ = literal_blocks("Kubernetes")[:2]
    (tmp_path / "deploy" / "kubernetes").mkdir(parents=True)
    shutil.copy(PROD, tmp_path / "deploy" / "kubernetes" / "prod.toml")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    assert shutil.which("trio-supervisor", path=env["PATH"]), "the console script is installed"
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(workstation)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "configuration OK" in result.stdout
    edited = tomllib.loads((tmp_path / "deploy" / "kubernetes" / "prod.toml").read_text())
    [key] = edited["cache"]["trusted_keys"]
    assert key.startswith("ed25519:") and "REPLACE" not in key
    assert (tmp_path / "admin.token").stat().st_mode & 0o077 == 0


def _secret_refs(objects: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Secret name -> keys the StatefulSet needs."""
    needed: dict[str, set[str]] = {}
    for deployment in (o for o in objects if o["kind"] == "StatefulSet"):
        pod = deployment["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            secret = volume.get("secret")
            if secret and not secret.get("optional"):
                keys = {item["key"] for item in secret.get("items", [])}
                needed.setdefault(secret["secretName"], set()).update(keys)
        for container in pod["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    needed.setdefault(ref["name"], set()).add(ref["key"])
    return needed


def _mounted_secret_files(objects: list[dict[str, Any]]) -> dict[str, str]:
    """Path in the pod -> Secret name, for the files prod.toml names."""
    deployment = next(o for o in objects if o["kind"] == "StatefulSet")
    pod = deployment["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    return {path: secrets[name] for path, name in mounts.items() if name in secrets}


def test_kubernetes_apply_steps_follow_a_working_order(tmp_path: Path) -> None:
    _, cluster = literal_blocks("Kubernetes")[:2]
    namespaces: set[str] = {"default", "kube-system"}
    secrets: dict[tuple[str, str], set[str]] = {}
    applied: list[str] = []
    for line in cluster:
        argv = shlex.split(line, comments=True)
        assert argv[0] == "kubectl", line
        if argv[1:3] == ["apply", "-k"]:
            directory = REPO / argv[3]
            if argv[3] == "deploy/prometheus":
                applied.append(argv[3])  # CRDs of the Prometheus Operator: not ours to render
                continue
            objects = kustomize(directory)
            created = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
            for obj in objects:
                ns = obj["metadata"].get("namespace")
                assert ns is None or ns in namespaces | created, \
                    f"{line}: {obj['kind']} {obj['metadata']['name']} in missing namespace {ns}"
            for name, keys in _secret_refs(objects).items():
                ns = next(o["metadata"]["namespace"] for o in objects if o["kind"] == "StatefulSet")
                assert (ns, name) in secrets, f"{line}: Secret {name} not created before"
                assert keys <= secrets[(ns, name)], f"{line}: Secret {name} lacks {keys}"
            namespaces |= created
            applied.append(argv[3])
        elif argv[1] == "-n" and argv[3:6] == ["create", "secret", "generic"]:
            ns, name = argv[2], argv[6]
            assert ns in namespaces, f"{line}: namespace {ns} does not exist yet"
            keys = {a.split("=", 2)[1] for a in argv[7:] if a.startswith("--from-")}
            secrets[(ns, name)] = keys
        elif argv[1:3] == ["label", "namespace"]:
            # Who may reach the admin port: the label the NetworkPolicy admits.
            policy = [o for o in kustomize(REPO / "deploy" / "kubernetes")
                      if o["kind"] == "NetworkPolicy"]
            key = argv[4].split("=", 1)[0]
            assert policy and key in json.dumps(policy), f"{line}: no NetworkPolicy admits {key}"
        else:
            pytest.fail(f"unexpected command in docs/operations.md: {line}")
    assert applied[-2:] == ["deploy/kubernetes", "deploy/prometheus"]
    # Every Secret the configuration's files come from was created, with that file's key.
    objects = kustomize(REPO / "deploy" / "kubernetes")
    config = tomllib.loads(PROD.read_text())
    for path in (config["admin"]["token_file"], config["cache"]["signing_key"]):
        directory, filename = str(Path(path).parent), Path(path).name
        secret = _mounted_secret_files(objects)[directory]
        assert filename in secrets[("trio-supervisor", secret)], (path, secret)


def test_kubernetes_secret_files_are_readable_by_the_pod_user() -> None:
    objects = kustomize(REPO / "deploy" / "kubernetes")
    pod = next(o for o in objects if o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    context = pod["securityContext"]
    for volume in (v for v in pod["volumes"] if "secret" in v):
        mode = volume["secret"].get("defaultMode", 0o644)
        readable_by_group = mode & 0o040 and context.get("fsGroup") is not None
        assert readable_by_group or mode & 0o004, volume
        assert not mode & 0o004, f"{volume['name']}: world-readable"


def test_container_steps_give_the_image_user_its_files() -> None:
    blocks = literal_blocks("Containers")
    steps = next(b for b in blocks if any(line.startswith("docker run") for line in b))
    user = dict(containerfile_stages(
        (REPO / "deploy" / "container" / "Containerfile").read_text())[-1])["USER"].split(":")[0]
    run = shlex.split(next(line for line in steps if line.startswith("docker run")))
    source = next(v.split(":")[0] for flag, v in itertools.pairwise(run)
                  if flag == "-v" and v.split(":")[1] == "/etc/trio-supervisor")
    installed: dict[str, str] = {}
    for line in steps:
        argv = shlex.split(line)
        if argv[0] != "install" or "-d" in argv:
            continue
        owner = argv[argv.index("-o") + 1] if "-o" in argv else "root"
        *files, target = [a for i, a in enumerate(argv[1:], 1)
                          if not a.startswith("-") and argv[i - 1] not in ("-m", "-o", "-g")]
        for f in files:
            name = Path(target).name if len(files) == 1 and not target.endswith("/") \
                else Path(f).name
            installed[name] = owner
    assert any(line.startswith(f"install -d -m 0750 -o {user}") and source in line
               for line in steps)
    config = tomllib.loads((REPO / "conf" / "prod.toml").read_text())
    for path in (config["admin"]["token_file"], config["cache"]["signing_key"]):
        assert Path(path).parent == Path("/etc/trio-supervisor")
        assert installed.get(Path(path).name) == user, (path, installed)
    assert "prod.toml" in installed


def test_pod_disruption_budget_lets_a_drain_take_one_replica_of_two() -> None:
    objects = kustomize(REPO / "deploy" / "kubernetes")
    [pdb] = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    [replicas] = [o for o in objects if o["kind"] == "StatefulSet"]
    assert pdb["spec"]["maxUnavailable"] == 1 < replicas["spec"]["replicas"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= \
        replicas["spec"]["template"]["metadata"]["labels"].items()
    assert "PodDisruptionBudget" in OPERATIONS and "node drain" in OPERATIONS


def test_readme_check_example_is_what_check_prints() -> None:
    [block] = [b for b in literal_blocks("Configuration")
               if b and b[0].startswith("$ trio-supervisor check")]
    argv = shlex.split(block[0][2:])
    result = cli(*argv[1:], check=False)
    assert result.returncode == 2
    shown = block[1:]
    printed = result.stderr.splitlines()
    assert shown[0] == printed[0]  # the placeholder line does not depend on the host
    for line in shown[1:]:
        assert line in printed or "/etc/trio-supervisor" in line, line
