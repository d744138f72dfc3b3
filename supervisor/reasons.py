"""The one catalogue of every low-cardinality label this daemon emits.

Metrics pre-initialise every label listed here, the status report and the
stream use exactly these strings, and the README's troubleshooting table is
keyed by them. A new label is added here first; nothing else spells one.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

# Why a candidate revision was refused (docs/reasons.md). The
# Literal is the one source: the tuple is derived from it, and each constant
# below is checked against it (by mypy, and at import).
RevisionReason = Literal[
    "unavailable",  # connection failure or timeout
    "conflict",  # serialization conflict
    "not_found",  # desired points at a missing revision
    "invalid",  # the store refused a malformed request
    "denied",  # privileges, or a body over max_revision_bytes
    "corrupt",  # digest mismatch or undecodable body
    "incompatible",  # schema_version newer than this build reads
    "validation",  # shape or constraint, with the $.path
    "projection",  # a key names an unknown alias
    "secret",  # a secret reference cannot be resolved
    "snapshot",  # the snapshot cannot be built
    "rollback",  # follower: the upstream served an older statement than accepted
    "stale",  # follower: the root's signed statement has expired
]

REVISION_REASONS: Final[tuple[RevisionReason, ...]] = get_args(RevisionReason)

UNAVAILABLE: Final = "unavailable"
CONFLICT: Final = "conflict"
NOT_FOUND: Final = "not_found"
INVALID: Final = "invalid"
DENIED: Final = "denied"
CORRUPT: Final = "corrupt"
INCOMPATIBLE: Final = "incompatible"
VALIDATION: Final = "validation"
PROJECTION: Final = "projection"
SECRET: Final = "secret"
SNAPSHOT: Final = "snapshot"
ROLLBACK: Final = "rollback"
STALE: Final = "stale"

# mypy checks every constant is one of the Literal's labels; the import fails
# when a label of the Literal has no constant.
_CONSTANTS: Final[tuple[RevisionReason, ...]] = (
    UNAVAILABLE, CONFLICT, NOT_FOUND, INVALID, DENIED, CORRUPT, INCOMPATIBLE, VALIDATION,
    PROJECTION, SECRET, SNAPSHOT, ROLLBACK, STALE,
)
assert set(_CONSTANTS) == set(REVISION_REASONS), "a reason label without its constant"

# Refusals to boot that are not a revision reason (a boot refusal otherwise
# carries the reason of the revision or store failure that caused it).
BOOT_REFUSALS: Final = ("empty", "cache")

# What one convergence attempt did.
OUTCOMES: Final = ("published", "converged", "empty", "rejected")

# Why a fan-out preflight failed (docs/reasons.md, `last_error_class`).
SCHEMA_SKEW: Final = "schema_skew"
NAMESPACE_OR_RBAC_UNREADY: Final = "namespace_or_rbac_unready"
# Issue 13: the API server does not serve a child's group/version/resource at all
# (kube-apiserver 1.20 has no batch/v1 CronJob): no manifest in this repository fixes it.
CHILD_API_MISSING: Final = "child_api_missing"
FANOUT_ERROR_CLASSES: Final = (SCHEMA_SKEW, NAMESPACE_OR_RBAC_UNREADY, CHILD_API_MISSING)
FANOUT_KINDS: Final = ("ServiceDefinition", "Workflow")
FANOUT_APPLY_RESULTS: Final = ("applied", "unchanged", "deleted", "conflict", "error",
                               "repaired")
# Issue 13: how one reconcile ended, and why a parent was requeued.
FANOUT_RECONCILE_RESULTS: Final = ("success", "conflict", "invalid", "error")
FANOUT_REQUEUE_CAUSES: Final = ("conflict", "throttled", "error")

# Last-known-good cache events.
LKG_EVENTS: Final = ("exported", "export_failed", "restored", "refused")
SINKS: Final = ("snapshot_file", "cache")
#: A side sink's state (``supervisor_sink_state{state}``, ``/status`` ``sinks``).
SINK_STATES: Final = ("ok", "failing", "disabled")
