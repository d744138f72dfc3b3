"""Defaulting of the fake Kubernetes API server (a subset of kube-apiserver's defaults).

What a client reads back differs from what it wrote, as with the real server: Deployment
replicas, revisionHistoryLimit, progressDeadlineSeconds and strategy; Service type,
sessionAffinity, clusterIP(s) and ports' protocol/targetPort; CronJob and Job fields; pod
template defaults (restartPolicy, dnsPolicy, imagePullPolicy from the tag, ...);
ServiceDefinition replicas; a Namespace's phase and ``kubernetes.io/metadata.name`` label.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fakes.apiserver_resources import Obj, ResourceType


def _pull_policy(image: Any) -> str:
    if not isinstance(image, str) or "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _default_pod_template(tmpl: Any) -> None:
    """The pod-template defaults a real server adds (so reads differ from what was sent)."""
    if not isinstance(tmpl, dict) or not isinstance(tmpl.get("spec"), dict):
        return
    spec = tmpl["spec"]
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        container.setdefault("resources", {})
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", _pull_policy(container.get("image")))
        for port in container.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")


def apply_defaults(res: ResourceType, obj: Obj, old: Obj | None, alloc_ip: Callable[[], str],
                   ) -> None:
    """Fill the server-side defaults a client sees in its reads (a subset)."""
    spec = obj.get("spec")
    if res.plural == "namespaces":
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj["status"] = (old or {}).get("status") or {"phase": "Active"}
        md = obj.setdefault("metadata", {})
        md.setdefault("labels", {})["kubernetes.io/metadata.name"] = md.get("name", "")
        return
    if not isinstance(spec, dict):
        return
    if res.plural == "deployments":
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault("strategy", {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxSurge": "25%",
                                                       "maxUnavailable": "25%"}})
        _default_pod_template(spec.get("template"))
    elif res.plural == "services":
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec.get("type") in ("ClusterIP", "NodePort", "LoadBalancer"):
            old_ip = ((old or {}).get("spec") or {}).get("clusterIP")
            if not spec.get("clusterIP"):
                spec["clusterIP"] = old_ip or alloc_ip()
            if spec["clusterIP"] != "None":
                spec["clusterIPs"] = [spec["clusterIP"]]
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                if "port" in port:
                    port.setdefault("targetPort", port["port"])
    elif res.plural == "cronjobs":
        spec.setdefault("suspend", False)
        spec.setdefault("concurrencyPolicy", "Allow")
        spec.setdefault("successfulJobsHistoryLimit", 3)
        spec.setdefault("failedJobsHistoryLimit", 1)
        job = (spec.get("jobTemplate") or {}).get("spec") if isinstance(
            spec.get("jobTemplate"), dict) else None
        if isinstance(job, dict):
            job.setdefault("backoffLimit", 6)
            job.setdefault("completions", 1)
            job.setdefault("parallelism", 1)
            job.setdefault("completionMode", "NonIndexed")
            job.setdefault("suspend", False)
            _default_pod_template(job.get("template"))
    elif res.plural == "servicedefinitions":
        spec.setdefault("replicas", 1)


__all__ = ["apply_defaults"]
