"""``docs/metrics.md``: every Prometheus metric, read from a real registry.

A :class:`~supervisor.telemetry.Metrics` is built (``process=False``: the
standard ``process_*``/``python_*`` collectors are named, not listed) and its
registry collected: name, type, help, label names, and the label values the
registry pre-initialises (all from :mod:`supervisor.reasons`). The leader
election's two metrics (:class:`~supervisor.fanout.leadership.LeadershipMetrics`,
exported only with leader election) are added to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from supervisor import __version__
from supervisor.fanout.leadership import LeadershipMetrics
from supervisor.telemetry import Metrics
from tools.docsgen.common import HEADER, code, table

__all__ = ["MetricDoc", "metric_docs", "render_metrics"]

# Sample suffixes a family's type adds to its name, besides the bare name.
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
             "summary": ("_count", "_sum"), "gauge": ("",), "info": ("_info",)}


@dataclass
class MetricDoc:
    name: str
    type: str
    help: str
    labels: dict[str, set[str]] = field(default_factory=dict)
    series: set[str] = field(default_factory=set)


def metric_docs() -> list[MetricDoc]:
    """One entry per metric family of a fresh registry, sorted by name."""
    metrics = Metrics(process=False)
    # Registered by the elected fan-out child (with [kubernetes].leader_election).
    LeadershipMetrics(metrics.registry)
    found: list[MetricDoc] = []
    for family in metrics.registry.collect():
        doc = MetricDoc(family.name, family.type, family.documentation)
        for suffix in _SUFFIXES.get(family.type, ("",)):
            doc.series.add(family.name + suffix)
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label != "le":  # the histogram's bucket bound, not a label of ours
                    doc.labels.setdefault(label, set()).add(value)
        found.append(doc)
    # Labels declared but not pre-initialised (their values are open) show no sample.
    for collector in list(metrics.registry._collector_to_names):
        names = getattr(collector, "_labelnames", ())
        name = getattr(collector, "_name", None)
        for doc in found:
            if doc.name == name:
                for label in names:
                    doc.labels.setdefault(label, set())
    return sorted(found, key=lambda d: d.name)


def _values(label: str, values: set[str]) -> str:
    if not values:
        return f"`{label}`: any (not pre-initialised)"
    if values == {__version__}:
        return f"`{label}`: this build's version"
    return f"`{label}`: " + ", ".join(code(v) for v in sorted(values))


def render_metrics() -> str:
    docs = metric_docs()
    rows = []
    for doc in docs:
        labels = "; ".join(_values(label, values) for label, values in sorted(doc.labels.items()))
        rows.append((", ".join(code(s) for s in sorted(doc.series)), doc.type, doc.help,
                     labels or "—"))
    return "".join([
        HEADER, "# Metrics\n\n",
        "Every Prometheus metric on `GET /metrics` (Prometheus text, or OpenMetrics when "
        "the `Accept` header asks for it), read from the registry the daemon builds. Every "
        "label value listed is pre-initialised to 0, so a `rate()` over one never seen is 0, "
        "not absent; revision ids are gauge values, never labels. No `_created` series are "
        "exported. The standard `process_*` and `python_*` collectors of prometheus_client "
        "are exported beside these.\n\n",
        table(("series", "type", "help", "labels (allowed values)"), rows),
    ])
