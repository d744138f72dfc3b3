"""Validation of the fake Kubernetes API server (a small, realistic subset).

Follows kube-apiserver's 422 ``Invalid`` answers (a ``Status`` with ``FieldValueInvalid``
causes and the ``<Kind> "<name>" is invalid: ...`` message): object names (DNS-1035 for
Services, RFC 1123 labels for Namespaces, subdomains otherwise, 52 characters for
CronJobs), label and annotation keys and values, Deployment selector (present, matching
the template, immutable), containers with name and image, Service ports and clusterIP
immutability, CronJob schedule and the job's restartPolicy, and the CRDs' OpenAPI types.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.fakes.apiserver_errors import ApiError
from tests.fakes.apiserver_resources import Obj, ResourceType
from tests.fakes.apiserver_selectors import Requirement

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QNAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _check_name(res: ResourceType, name: str) -> str | None:
    if res.plural == "services":
        ok = len(name) <= 63 and bool(_DNS1035.match(name))
        kind = "a DNS-1035 label"
    elif res.plural == "namespaces":
        ok = len(name) <= 63 and bool(_DNS_LABEL.match(name))
        kind = "a lowercase RFC 1123 label"
    else:
        limit = 52 if res.plural == "cronjobs" else 253
        ok = len(name) <= limit and bool(_DNS_SUBDOMAIN.match(name))
        kind = "a lowercase RFC 1123 subdomain" + (" of at most 52 characters"
                                                     if limit == 52 else "")
    return None if ok else f'metadata.name: Invalid value: "{name}": must be {kind}'


def _check_labels(labels: Any, field_name: str, errors: list[tuple[str, str]]) -> None:
    if labels is None:
        return
    if not isinstance(labels, dict):
        errors.append((field_name, f"{field_name}: Invalid value: must be a map of strings"))
        return
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))) or not (
            len(name) <= 63 and _QNAME.match(name)
        ):
            errors.append((field_name, f'{field_name}: Invalid value: "{key}": '
                                       "name part must be a valid qualified name"))
        if field_name.endswith("labels"):
            if not isinstance(value, str) or len(value) > 63 or (value and not _QNAME.match(value)):
                errors.append((f"{field_name}", f'{field_name}: Invalid value: "{value}": a valid '
                                                "label must be an empty string or 63 characters "
                                                "or less of alphanumerics, '-', '_' or '.'"))
        elif not isinstance(value, str):
            errors.append((field_name, f"{field_name}: Invalid value: values must be strings"))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null"


def _check_selector_matches(selector: Any, labels: Any) -> bool:
    if not isinstance(selector, dict):
        return False
    labels = labels if isinstance(labels, dict) else {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(
            expr.get("operator"), "in")
        if not Requirement(expr.get("key", ""), op, tuple(expr.get("values") or ())).matches(
                labels):
            return False
    return True


def _check_pod_template(tmpl: Any, prefix: str, errors: list[tuple[str, str]],
                        job: bool = False) -> None:
    if not isinstance(tmpl, dict):
        errors.append((prefix, f"{prefix}: Required value"))
        return
    _check_labels((tmpl.get("metadata") or {}).get("labels"), f"{prefix}.metadata.labels",
                  errors)
    spec = tmpl.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or not containers:
        errors.append((f"{prefix}.spec.containers", f"{prefix}.spec.containers: Required value"))
    else:
        for i, c in enumerate(containers):
            cp = f"{prefix}.spec.containers[{i}]"
            if not isinstance(c, dict):
                errors.append((cp, f"{cp}: Invalid value: must be an object"))
                continue
            if not isinstance(c.get("name"), str) or not _DNS_LABEL.match(c.get("name") or ""):
                errors.append((f"{cp}.name", f"{cp}.name: Required value"))
            if not isinstance(c.get("image"), str) or not c.get("image"):
                errors.append((f"{cp}.image", f"{cp}.image: Required value"))
    if job and isinstance(spec, dict):
        policy = spec.get("restartPolicy", "Always")
        if policy not in ("OnFailure", "Never"):
            errors.append((f"{prefix}.spec.restartPolicy",
                           f'{prefix}.spec.restartPolicy: Required value: valid values: '
                           f'"OnFailure", "Never"'))


def _validate_deployment(obj: Obj, old: Obj | None, errors: list[tuple[str, str]]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errors.append(("spec", "spec: Required value"))
        return
    if "replicas" in spec and (not _is_int(spec["replicas"]) or spec["replicas"] < 0):
        errors.append(("spec.replicas", f'spec.replicas: Invalid value: {spec["replicas"]!r}: '
                                        "must be greater than or equal to 0"))
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not (selector.get("matchLabels")
                                              or selector.get("matchExpressions")):
        errors.append(("spec.selector", "spec.selector: Required value"))
    else:
        tmpl_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
        if not _check_selector_matches(selector, tmpl_labels):
            errors.append(("spec.template.metadata.labels",
                           f"spec.template.metadata.labels: Invalid value: {tmpl_labels!r}: "
                           "`selector` does not match template `labels`"))
        if old is not None and (old.get("spec") or {}).get("selector") != selector:
            errors.append(("spec.selector", f"spec.selector: Invalid value: {selector!r}: "
                                            "field is immutable"))
    _check_pod_template(spec.get("template"), "spec.template", errors)


def _validate_service(obj: Obj, old: Obj | None, errors: list[tuple[str, str]]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errors.append(("spec", "spec: Required value"))
        return
    ports = spec.get("ports")
    if ports is not None and not isinstance(ports, list):
        errors.append(("spec.ports", "spec.ports: Invalid value: must be a list"))
        ports = []
    headless = spec.get("clusterIP") == "None"
    if spec.get("type", "ClusterIP") != "ExternalName" and not headless and not ports:
        errors.append(("spec.ports", "spec.ports: Required value"))
    for i, p in enumerate(ports or []):
        port = p.get("port") if isinstance(p, dict) else None
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            errors.append((f"spec.ports[{i}].port",
                           f"spec.ports[{i}].port: Invalid value: {port!r}: must be between 1 "
                           "and 65535, inclusive"))
    if ports and len(ports) > 1 and any(not (isinstance(p, dict) and p.get("name"))
                                        for p in ports):
        errors.append(("spec.ports", "spec.ports[0].name: Required value"))
    if old is not None:
        old_ip = (old.get("spec") or {}).get("clusterIP")
        new_ip = spec.get("clusterIP")
        if old_ip and new_ip and new_ip != old_ip:
            errors.append(("spec.clusterIP", f'spec.clusterIP: Invalid value: "{new_ip}": '
                                             "field is immutable"))


def _validate_cronjob(obj: Obj, old: Obj | None, errors: list[tuple[str, str]]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errors.append(("spec", "spec: Required value"))
        return
    schedule = spec.get("schedule")
    if not isinstance(schedule, str) or not schedule.strip():
        errors.append(("spec.schedule", "spec.schedule: Required value"))
    elif not schedule.startswith("@") and len(schedule.split()) != 5:
        errors.append(("spec.schedule", f'spec.schedule: Invalid value: "{schedule}": '
                                        f"expected exactly 5 fields, found "
                                        f"{len(schedule.split())}"))
    job_spec = (spec.get("jobTemplate") or {}).get("spec") if isinstance(
        spec.get("jobTemplate"), dict) else None
    if not isinstance(job_spec, dict):
        errors.append(("spec.jobTemplate", "spec.jobTemplate.spec: Required value"))
        return
    _check_pod_template(job_spec.get("template"), "spec.jobTemplate.spec.template", errors,
                        job=True)


# CRD schemas: spec field -> (type, required)
_CRD_SCHEMAS: dict[str, dict[str, tuple[str, bool]]] = {
    "servicedefinitions": {"image": ("string", True), "replicas": ("integer", False),
                           "port": ("integer", False), "env": ("map[string]string", False)},
    "workflows": {"image": ("string", True), "schedule": ("string", True),
                  "args": ("[]string", False)},
}


def _validate_crd(obj: Obj, plural: str, errors: list[tuple[str, str]]) -> None:
    schema = _CRD_SCHEMAS.get(plural)
    if schema is None:
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errors.append(("spec", "spec: Required value"))
        return
    for name, (typ, required) in schema.items():
        fld = f"spec.{name}"
        if name not in spec:
            if required:
                errors.append((fld, f"{fld}: Required value"))
            continue
        value = spec[name]
        ok = {
            "string": isinstance(value, str),
            "integer": _is_int(value),
            "map[string]string": isinstance(value, dict)
            and all(isinstance(v, str) for v in value.values()),
            "[]string": isinstance(value, list) and all(isinstance(v, str) for v in value),
        }[typ]
        if not ok:
            want = {"map[string]string": "object", "[]string": "array"}.get(typ, typ)
            errors.append((fld, f'{fld}: Invalid value: "{_type_name(value)}": {fld} in body '
                                f"must be of type {want}: {json.dumps(value)}"))
    if _is_int(spec.get("replicas")) and spec["replicas"] < 0:
        errors.append(("spec.replicas", "spec.replicas: Invalid value: "
                                        f"{spec['replicas']}: spec.replicas in body should be "
                                        "greater than or equal to 0"))
    if _is_int(spec.get("port")) and not 1 <= spec["port"] <= 65535:
        errors.append(("spec.port", f"spec.port: Invalid value: {spec['port']}: must be between "
                                    "1 and 65535"))


def validate(res: ResourceType, obj: Obj, old: Obj | None) -> None:
    """Raise 422 Invalid like the real server's validation (a subset of it)."""
    errors: list[tuple[str, str]] = []
    md = obj.get("metadata") or {}
    if msg := _check_name(res, str(md.get("name", ""))):
        errors.append(("metadata.name", msg))
    _check_labels(md.get("labels"), "metadata.labels", errors)
    _check_labels(md.get("annotations"), "metadata.annotations", errors)
    if res.crd:
        _validate_crd(obj, res.plural, errors)
    elif res.plural == "deployments":
        _validate_deployment(obj, old, errors)
    elif res.plural == "services":
        _validate_service(obj, old, errors)
    elif res.plural == "cronjobs":
        _validate_cronjob(obj, old, errors)
    if errors:
        name = md.get("name", "")
        what = f'{res.kind}{"." + res.group if res.group else ""} "{name}"'
        if len(errors) == 1:
            message = f"{what} is invalid: {errors[0][1]}"
        else:
            message = f"{what} is invalid: [{', '.join(m for _, m in errors)}]"
        raise ApiError(
            422,
            "Invalid",
            message,
            details={"name": name, "group": res.group, "kind": res.kind,
                     "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f}
                                for f, m in errors]},
        )


__all__ = ["validate"]
