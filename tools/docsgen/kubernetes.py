"""``docs/kubernetes.md``: every Kubernetes name the daemon reads or writes.

From the code that uses them: the fan-out kinds (:data:`supervisor.fanout.children.KINDS`:
parent resource, spec fields from the parent's Struct, child resources), the labels
every child carries (:func:`supervisor.fanout.labels.labels`, called per kind), the
other keys under the API group found as module constants, the names taken from
``[kubernetes]`` (every string key, with its default), the parent conditions
(:meth:`supervisor.fanout.parentstatus.StatusWant.conditions`), the Events
recorded (found in the source), and every :class:`~supervisor.kube.models.Resource`
defined at module level anywhere in the package.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from types import ModuleType

import msgspec

import supervisor
from supervisor.config import KubernetesConfig
from supervisor.fanout import labels as fanout_labels
from supervisor.fanout.children import KINDS
from supervisor.fanout.parentstatus import StatusWant
from supervisor.kube.models import Resource
from tools import docs_catalog
from tools.docsgen.common import HEADER, UNDESCRIBED, code, table
from tools.docsgen.settings import schema_default, schema_type
from tools.docsgen.sourcescan import kube_event_reasons, modules

__all__ = ["group_keys", "render_kubernetes", "resources"]



def _modules() -> Iterator[ModuleType]:
    """Every module of the package (not ``__main__``, which runs, nor this generator)."""
    yield supervisor
    for info in pkgutil.walk_packages(supervisor.__path__, "supervisor."):
        if info.name.endswith("__main__") or info.name.startswith("tools.docsgen"):
            continue
        yield importlib.import_module(info.name)


def resources() -> dict[tuple[str, str], tuple[Resource, set[str]]]:
    """(apiVersion, kind) → (resource, modules naming it) of every module-level Resource."""
    found: dict[tuple[str, str], tuple[Resource, set[str]]] = {}
    for module in _modules():
        for value in vars(module).values():
            if isinstance(value, Resource):
                entry = found.setdefault((value.api_version, value.kind), (value, set()))
                entry[1].add(module.__name__)
    return found


def group_keys() -> dict[str, set[str]]:
    """Every module-level string constant under the API group (label or annotation keys)."""
    prefix = fanout_labels.GROUP + "/"
    found: dict[str, set[str]] = {}
    for module in _modules():
        for value in vars(module).values():
            if isinstance(value, str) and value.startswith(prefix):
                found.setdefault(value, set()).add(module.__name__)
    return found


def _spec_rows(parent_type: type) -> list[tuple[str, str, str]]:
    schema = msgspec.json.schema(parent_type)
    defs = schema["$defs"]
    top = defs[schema["$ref"].rsplit("/", 1)[-1]]
    spec = defs[top["properties"]["spec"]["$ref"].rsplit("/", 1)[-1]]
    required = set(spec.get("required", []))
    return [(code(key), schema_type(prop), schema_default(prop, key in required))
            for key, prop in spec["properties"].items()]


def render_kubernetes() -> str:
    out = [HEADER, "# Kubernetes\n\n",
           "With `[kubernetes].enabled`, the daemon watches custom resources in "
           "`control_namespace` and fans each one out into children in `apps_namespace` "
           "under the parent's name, written with server-side apply. These are the names it "
           "uses; `manifests/` installs the CRDs and RBAC (`kubectl apply -k "
           "manifests/crds`).\n\n## Custom resources\n"]
    for kind in KINDS:
        children = ", ".join(f"{code(r.kind)} ({code(r.api_version)})"
                             for r in kind.child_resources)
        out.append(f"\n### `{kind.kind}`\n\n"
                   f"`apiVersion: {kind.resource.api_version}`, plural "
                   f"`{kind.resource.plural}`, namespaced; fans out to {children}. The spec "
                   "fields the daemon reads (others are ignored):\n\n")
        out.append(table(("spec field", "type", "default"), _spec_rows(kind.parent_type)))
    out.append("\n## Labels on every child\n\n"
               "`<parent>` is the parent's name, `<installation>` is "
               "`[kubernetes].installation` (default: the control namespace). Children are "
               "found again (and orphans swept) by these labels, never by owner references, "
               "which Kubernetes ignores across namespaces.\n\n")
    rows: dict[str, tuple[str, set[str]]] = {}
    for kind in KINDS:
        for key, value in fanout_labels.labels("<parent>", kind.lineage_key,
                                               "<installation>").items():
            rows.setdefault(key, (value, set()))[1].add(kind.kind)
    out.append(table(("label", "value", "on children of"),
                     [(code(k), code(v), ", ".join(sorted(kinds)))
                      for k, (v, kinds) in rows.items()]))
    others = {k: m for k, m in group_keys().items() if k not in rows}
    if others:
        out.append("\nOther keys under the API group (annotations):\n\n")
        out.append(table(("key", "meaning", "used by"),
                         [(code(k), docs_catalog.KUBE_KEYS.get(k, UNDESCRIBED),
                           ", ".join(code(m) for m in sorted(mods)))
                          for k, mods in sorted(others.items())]))
    out.append("\n## Names from the configuration\n\n"
               "Every string-valued key of `[kubernetes]` ([configuration.md]"
               "(configuration.md#kubernetes)):\n\n")
    schema = msgspec.json.schema(KubernetesConfig)
    props = schema["$defs"]["KubernetesConfig"]["properties"]
    out.append(table(("key", "default", "meaning"),
                     [(code(key), schema_default(prop, False),
                       docs_catalog.CONFIG_KEYS.get(f"kubernetes.{key}", UNDESCRIBED))
                      for key, prop in props.items()
                      if schema_type(prop).startswith("string")]))
    out.append("\n## Parent status\n\n"
               "Written on each parent's status subresource (server-side apply, only when it "
               "changes), with `observedGeneration`:\n\n")
    conditions = [c[0] for c in StatusWant(0, ("True", "", "")).conditions()]
    out.append(table(("condition", "meaning"),
                     [(code(c), docs_catalog.KUBE_CONDITIONS.get(c, UNDESCRIBED))
                      for c in conditions]))
    out.append("\n## Events\n\n"
               "Recorded on the parent, best effort (a refused write is logged, never "
               "fatal); the same event within a short window is recorded once.\n\n")
    events: dict[tuple[str, str], set[str]] = {}
    for module, tree in modules():
        for type_, reason in kube_event_reasons(tree):
            events.setdefault((reason, type_), set()).add(module)
    out.append(table(("reason", "type", "recorded by"),
                     [(code(reason), type_, ", ".join(code(m) for m in sorted(mods)))
                      for (reason, type_), mods in sorted(events.items())]))
    out.append("\n## API resources\n\n"
               "Every resource the daemon names (its RBAC must allow what it does with "
               "them):\n\n")
    out.append(table(("kind", "apiVersion", "plural", "named in"),
                     [(code(r.kind), code(r.api_version), code(r.plural),
                       ", ".join(code(m) for m in sorted(mods)))
                      for (_, _), (r, mods) in sorted(resources().items())]))
    return "".join(out)
