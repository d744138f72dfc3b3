"""Secret-file modes at check and boot, and the security properties of deploy/."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import trio
import yaml

from supervisor.configfile import load
from tests.proc import EXAMPLE, REPO, acli, cli, free_port, run_daemon, write_config

# Secret references confined: otherwise `check --strict` refuses for that alone.
CONFINED = f'[revision]\nsecret_env_prefixes = ["TEAM_"]\nsecret_dirs = ["{REPO}/conf"]\n'


async def test_check_warns_when_secret_references_are_confined_nowhere(tmp_path: Path) -> None:
    """Neither allow-list set: `check` warns (a publisher may have any variable or
    readable file hashed and served), `check --strict` exits 2; either list set, silence."""
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    cli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(60):
        lenient = await acli("check", "--config", str(config))
        assert "$.revision: neither secret_env_prefixes nor secret_dirs is set" in lenient.stderr
        strict = await acli("check", "--strict", "--config", str(config), check=False)
        assert strict.returncode == 2 and "$.revision" in strict.stderr, strict
        for confinement in ('secret_env_prefixes = ["TEAM_"]', 'secret_dirs = ["/run/keys"]'):
            config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                                  f"[revision]\n{confinement}\n")
            quiet = await acli("check", "--strict", "--config", str(config))
            assert "$.revision" not in quiet.stderr, (confinement, quiet.stderr)


def test_shipped_production_configs_confine_secret_references() -> None:
    from supervisor.configchecks import unconfined_secrets

    for path in ("conf/prod.toml", "deploy/kubernetes/prod.toml", "conf/dev.toml"):
        config = load(REPO / path)
        assert config.revision.secret_env_prefixes and config.revision.secret_dirs, path
        assert not unconfined_secrets(config), path  # dev too: it passes check --strict


async def test_check_and_boot_warn_about_a_world_readable_token(tmp_path: Path) -> None:
    token = tmp_path / "admin.token"
    token.write_text("tok-en\n")
    token.chmod(0o644)
    port = free_port()
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db",
                          f'token_file = "{token}"\n{CONFINED}', port=port)
    cli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(60):
        lenient = await acli("check", "--config", str(config))
        assert "$.admin.token_file" in lenient.stderr and "readable by others" in lenient.stderr
        assert "tok-en" not in lenient.stderr
        strict = await acli("check", "--strict", "--config", str(config), check=False)
        assert strict.returncode == 2
        async with run_daemon(config) as daemon:
            line = await daemon.wait_log("secret file too open")
            assert line["key"] == "$.admin.token_file" and line["level"] == "warning"
            await daemon.wait_log("ready")
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
        token.chmod(0o600)
        assert (await acli("check", "--strict", "--config", str(config))).returncode == 0


async def test_check_strict_refuses_group_readable_token_and_signing_key(tmp_path: Path) -> None:
    """Group-readable counts when the group is not the daemon's own (another group's
    members could read it); the signing key is held to the same rule as the token."""
    token = tmp_path / "admin.token"
    token.write_text("tok-en\n")
    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.split()[-1]
    config = write_config(
        tmp_path, f"sqlite:///{tmp_path}/cp.db",
        f'token_file = "{token}"\n[cache]\npath = "{tmp_path / "lkg.bin"}"\n'
        f'signing_key = "{key}"\ntrusted_keys = ["{verify}"]\n{CONFINED}')
    foreign_gid = os.getegid() + 4242
    with trio.fail_after(60):
        for path, other in ((token, key), (key, token)):
            other.chmod(0o600)
            os.chown(path, -1, foreign_gid)
            path.chmod(0o640)
            result = await acli("check", "--strict", "--config", str(config), check=False)
            assert result.returncode == 2, result
            assert f"readable by group {foreign_gid}" in result.stderr and str(path) in result.stderr
            assert str(other) not in result.stderr
            # The daemon's own group (a Kubernetes fsGroup) is not a leak.
            os.chown(path, -1, os.getegid())
            assert (await acli("check", "--strict", "--config", str(config))).returncode == 0
            path.chmod(0o604)
            result = await acli("check", "--strict", "--config", str(config), check=False)
            assert result.returncode == 2 and "readable by others" in result.stderr, result
            path.chmod(0o600)


def _docs(path: Path) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_base_image_is_pinned_by_digest() -> None:
    text = (REPO / "deploy/container/Containerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:[\w.-]+@sha256:[0-9a-f]{64}$", text, re.M)
    assert "imagetools inspect" in (REPO / "docs" / "operations.md").read_text()  # the update


def test_kubernetes_deployment_keeps_the_password_out_of_the_environment() -> None:
    (deployment,) = _docs(REPO / "deploy/kubernetes/statefulset.yaml")
    spec = deployment["spec"]["template"]["spec"]  # type: ignore[index]
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert "SUPERVISOR_CONTROL_PLANE__URL" not in env
    assert env["PGPASSFILE"]["value"] == "/run/pgpass/pgpass"
    init = spec["initContainers"][0]
    assert "0o600" in " ".join(init["command"])
    config = load(REPO / "deploy/kubernetes/prod.toml")
    assert ":" not in config.control_plane.url.split("@")[0].split("//")[1]  # no password
    for path in ("deploy/kubernetes/prod.toml", "conf/prod.toml"):
        revision = load(REPO / path).revision
        assert revision.secret_env_prefixes and revision.secret_dirs, path
        assert load(REPO / path).admin.allowed_hosts, path
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert config.revision.secret_dirs[0] in mounts


def test_network_policy_admits_only_the_admin_port_from_labelled_namespaces() -> None:
    (policy,) = _docs(REPO / "deploy/kubernetes/networkpolicy.yaml")
    (deployment,) = _docs(REPO / "deploy/kubernetes/statefulset.yaml")
    labels = deployment["spec"]["template"]["metadata"]["labels"]  # type: ignore[index]
    spec = policy["spec"]  # type: ignore[index]
    assert spec["policyTypes"] == ["Ingress"]
    assert all(labels[k] == v for k, v in spec["podSelector"]["matchLabels"].items())
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "admin", "protocol": "TCP"}]
    assert {"namespaceSelector": {"matchLabels": {"trio-supervisor.dev/admin-access": "true"}}} \
        in rule["from"]
    kustomization = yaml.safe_load((REPO / "deploy/kubernetes/kustomization.yaml").read_text())
    assert "networkpolicy.yaml" in kustomization["resources"]


def test_apps_namespace_pod_security_and_least_privilege_rbac() -> None:
    (namespace,) = _docs(REPO / "manifests/apps-namespace/namespace.yaml")
    labels = namespace["metadata"]["labels"]  # type: ignore[index]
    assert labels["pod-security.kubernetes.io/enforce"] in ("baseline", "restricted")
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    for path in ("manifests/apps-namespace/role.yaml", "manifests/supervisor/role.yaml"):
        for doc in _docs(REPO / path):
            for rule in doc.get("rules", []):  # type: ignore[attr-defined]
                assert "*" not in rule["verbs"], (path, rule)
                # get only on objects named in the rule (the one election Lease).
                assert "get" not in rule["verbs"] or rule.get("resourceNames"), (path, rule)


def _grants(path: str) -> set[tuple[str, str, str, str]]:
    return {(group, resource, verb, ",".join(rule.get("resourceNames", [])))
            for doc in _docs(REPO / path) for rule in doc["rules"]  # type: ignore[attr-defined]
            for group in rule["apiGroups"] for resource in rule["resources"]
            for verb in rule["verbs"]}


def test_roles_grant_exactly_the_verbs_the_client_uses() -> None:
    """Least privilege: the Roles grant what the kube client sends and nothing more.

    What it sends (supervisor/kube): children are listed (also one by name, when a
    create found the name taken or an apply conflicted), watched, created (POST),
    applied (PATCH) and deleted; parents listed and watched, their status applied
    (PATCH); Events POSTed, and a repeat within its window PATCHed into the same
    Event (its count); a Lease created, and the one named Lease read (GET) and
    renewed (PUT)."""
    from supervisor.config import KubernetesConfig
    from supervisor.fanout.children import KINDS
    from supervisor.kube.events import EVENTS

    lease = KubernetesConfig().lease_name
    apps = {(child.group, child.plural, verb, "")
            for kind in KINDS for child in kind.child_resources
            for verb in ("list", "watch", "create", "patch", "delete")}
    control = {(kind.resource.group, kind.resource.plural, verb, "")
               for kind in KINDS for verb in ("list", "watch")}
    control |= {(kind.resource.group, f"{kind.resource.plural}/status", "patch", "")
                for kind in KINDS}
    control |= {(EVENTS.group, EVENTS.plural, "create", ""),
                (EVENTS.group, EVENTS.plural, "patch", ""),
                ("coordination.k8s.io", "leases", "create", ""),
                ("coordination.k8s.io", "leases", "get", lease),
                ("coordination.k8s.io", "leases", "update", lease)}
    assert _grants("manifests/apps-namespace/role.yaml") == apps
    assert _grants("manifests/supervisor/role.yaml") == control


def test_shipped_secret_places_exclude_the_daemons_own_credentials() -> None:
    """A publisher may point references only at the keys' place: never at the admin
    token, the cache signing key or the database password file (their digests would
    be served), nor at the daemon's own configuration variables."""
    from supervisor.revision.errors import RevisionError
    from supervisor.revision.secrets import EnvFileResolver

    (statefulset,) = _docs(REPO / "deploy/kubernetes/statefulset.yaml")
    spec = statefulset["spec"]["template"]["spec"]  # type: ignore[index]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    for path in ("deploy/kubernetes/prod.toml", "conf/prod.toml"):
        config = load(REPO / path)
        resolver = EnvFileResolver({}, env_prefixes=config.revision.secret_env_prefixes,
                                   dirs=config.revision.secret_dirs)
        own = [config.admin.token_file, config.cache.signing_key, env["PGPASSFILE"]]
        for reference in [f"file:{p}" for p in own if p] + [
                "env:SUPERVISOR_CONTROL_PLANE__URL", "env:PGPASSWORD", "env:PGPASSFILE"]:
            try:
                resolver.resolve(reference)
            except RevisionError as exc:
                assert "is outside [revision]" in exc.detail, (path, reference, exc.detail)
            else:
                raise AssertionError(f"{path}: {reference} is allowed")
