"""The manifests parse, list their files, and agree with the code that relies on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from supervisor.config import KubernetesConfig
from supervisor.fanout.children import KINDS
from supervisor.fanout.servicedefinition import ServiceDefinitionSpec
from supervisor.fanout.workflow import WorkflowSpec

yaml = pytest.importorskip("yaml")

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def objects(directory: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted((MANIFESTS / directory).glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += load(path)
    return out


@pytest.mark.parametrize("directory", ["crds", "apps-namespace", "supervisor"])
def test_every_file_parses_and_the_kustomization_lists_them_all(directory: str) -> None:
    (kustomization,) = load(MANIFESTS / directory / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    files = {p.name for p in (MANIFESTS / directory).glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    for name in files:
        for doc in load(MANIFESTS / directory / name):
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]


def _crd(plural: str) -> dict[str, Any]:
    (crd,) = [d for d in objects("crds") if d["spec"]["names"]["plural"] == plural]
    return crd


@pytest.mark.parametrize(
    ("plural", "spec_type"),
    [("servicedefinitions", ServiceDefinitionSpec), ("workflows", WorkflowSpec)],
)
def test_crd_schema_matches_what_the_code_reads(plural: str, spec_type: Any) -> None:
    (kind,) = [k for k in KINDS if k.resource.plural == plural]
    crd = _crd(plural)
    assert crd["metadata"]["name"] == f"{plural}.{kind.resource.group}"
    assert crd["spec"]["group"] == kind.resource.group
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["kind"] == kind.kind
    (version,) = crd["spec"]["versions"]
    assert version["name"] == kind.resource.version and version["storage"]
    assert version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    fields = msgspec.structs.fields(spec_type)
    assert set(spec["properties"]) == {f.encode_name for f in fields}
    required = {f.encode_name for f in fields if f.required}
    assert set(spec["required"]) == required
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"observedGeneration", "conditions"} <= set(status)


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_rbac_grants_what_the_reconcilers_do() -> None:
    defaults = KubernetesConfig()
    (sa,) = [d for d in objects("supervisor") if d["kind"] == "ServiceAccount"]
    assert sa["metadata"]["namespace"] == defaults.control_namespace
    (apps_ns,) = [d for d in objects("apps-namespace") if d["kind"] == "Namespace"]
    assert apps_ns["metadata"]["name"] == defaults.apps_namespace

    (apps_role,) = [d for d in objects("apps-namespace") if d["kind"] == "Role"]
    (control_role,) = [d for d in objects("supervisor") if d["kind"] == "Role"]
    apps, control = _rules(apps_role), _rules(control_role)
    for kind in KINDS:
        for child in kind.child_resources:
            # SSA creates need create; the child watches (drift repair) need watch.
            for verb in ("list", "watch", "create", "patch", "delete"):
                assert (child.group, child.plural, verb) in apps
        for verb in ("list", "watch"):
            assert (kind.resource.group, kind.resource.plural, verb) in control
        assert (kind.resource.group, f"{kind.resource.plural}/status", "patch") in control
    assert ("", "events", "create") in control  # Events on the parents
    assert ("", "events", "patch") in control  # a repeat counted into its Event
    # Leader election: create any Lease, get and update only the one named by default.
    assert ("coordination.k8s.io", "leases", "create") in control
    (named,) = [rule for rule in control_role["rules"] if rule.get("resourceNames")]
    assert named["resourceNames"] == [defaults.lease_name]
    assert set(named["verbs"]) == {"get", "update"} and named["resources"] == ["leases"]

    for directory, role in (("apps-namespace", apps_role), ("supervisor", control_role)):
        (binding,) = [d for d in objects(directory) if d["kind"] == "RoleBinding"]
        assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                        "namespace": sa["metadata"]["namespace"]}]
