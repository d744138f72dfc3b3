"""The one catalogue of every low-cardinality label this daemon emits.

Metrics pre-initialise every label here; status and stream use exactly these strings;
docs/operations.md's troubleshooting table is keyed by them. Add a label here first.
"""

from __future__ import annotations

from typing import Final

# Why a candidate revision was refused (docs/reasons.md).
UNAVAILABLE: Final = "unavailable"  # connection failure or timeout
CONFLICT: Final = "conflict"  # serialization conflict
NOT_FOUND: Final = "not_found"  # desired points at a missing revision
INVALID: Final = "invalid"  # the store refused a malformed request
DENIED: Final = "denied"  # privileges, or a body over max_revision_bytes
CORRUPT: Final = "corrupt"  # digest mismatch or undecodable body
INCOMPATIBLE: Final = "incompatible"  # schema_version newer than this build reads
VALIDATION: Final = "validation"  # shape or constraint, with the $.path
PROJECTION: Final = "projection"  # a key names an unknown alias
SECRET: Final = "secret"  # a secret reference cannot be resolved
SNAPSHOT: Final = "snapshot"  # the snapshot cannot be built
ROLLBACK: Final = "rollback"  # follower: the upstream served an older statement than accepted
STALE: Final = "stale"  # follower: the root's signed statement has expired
REVISION_REASONS: Final = (UNAVAILABLE, CONFLICT, NOT_FOUND, INVALID, DENIED, CORRUPT,
                           INCOMPATIBLE, VALIDATION, PROJECTION, SECRET, SNAPSHOT, ROLLBACK,
                           STALE)

# Refusals to boot that are not a revision reason (a boot refusal otherwise
# carries the reason of the revision or store failure that caused it).
BOOT_REFUSALS: Final = ("empty", "cache")

# What one convergence attempt did.
OUTCOMES: Final = ("published", "converged", "empty", "rejected")

# Why a fan-out preflight failed (docs/reasons.md, `last_error_class`).
SCHEMA_SKEW: Final = "schema_skew"
NAMESPACE_OR_RBAC_UNREADY: Final = "namespace_or_rbac_unready"
# The API server does not serve a child's group/version/resource at all
# (kube-apiserver 1.20 has no batch/v1 CronJob): no manifest in this repository fixes it.
CHILD_API_MISSING: Final = "child_api_missing"
# A watch or a child write that failed once running (a 5xx, a timeout, a 429, a body or a
# watch line over its bound); the others above may come from a running watch too.
TIMEOUT: Final = "timeout"
SERVER_ERROR: Final = "server_error"
THROTTLED: Final = "throttled"
TOO_LARGE: Final = "too_large"
FANOUT_ERROR_CLASSES: Final = (SCHEMA_SKEW, NAMESPACE_OR_RBAC_UNREADY, CHILD_API_MISSING,
                               TIMEOUT, SERVER_ERROR, THROTTLED, TOO_LARGE)
FANOUT_KINDS: Final = ("ServiceDefinition", "Workflow")
FANOUT_APPLY_RESULTS: Final = ("applied", "unchanged", "deleted", "conflict", "error",
                               "repaired")
# How one reconcile ended, and why a parent was requeued.
FANOUT_RECONCILE_RESULTS: Final = ("success", "conflict", "invalid", "error")
FANOUT_REQUEUE_CAUSES: Final = ("conflict", "throttled", "error")

# Last-known-good cache events.
LKG_EVENTS: Final = ("exported", "export_failed", "restored", "refused")
SINKS: Final = ("snapshot_file", "cache")
#: A side sink's state (``supervisor_sink_state{state}``, ``/status`` ``sinks``).
SINK_STATES: Final = ("ok", "failing", "disabled")
#: A follower's state as it names itself to its upstream (``supervisor_followers{state}``).
FOLLOWER_STATES: Final = ("converged", "converging", "refusing", "stale")
#: How a run of the reload hook ended (``supervisor_hook_runs_total{outcome}``).
HOOK_OUTCOMES: Final = ("ok", "failed", "timeout", "error")
