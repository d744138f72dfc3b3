"""The prose of the generated reference pages in ``docs/`` (see :mod:`supervisor.docsgen`).

Types, defaults, bounds, environment names, reason labels and log events come
from the code; what a key *means* and what to do about a label is written here,
keyed by name. A key or label missing here still gets its generated row (with
"(not described yet)"), and ``tests/unit/test_docsgen.py`` names what is missing.
"""

from __future__ import annotations

from typing import Final

CONFIG_KEYS: Final[dict[str, str]] = {
    "supervisor.shutdown_grace_s": "How long a SIGTERM/SIGINT shutdown may take before "
    "the remaining children are cancelled. Keep systemd's TimeoutStopSec (and the pod's "
    "terminationGracePeriodSeconds) above it plus 2 s.",
    "supervisor.restart_intensity": "Restarts of one child allowed within restart_period_s; "
    "one more and the process exits 4 so systemd or Kubernetes restart it whole.",
    "supervisor.restart_period_s": "The window restart_intensity is counted in.",
    "log.level": "The lowest level logged. SIGHUP re-reads it without a restart.",
    "log.format": "auto: journal when $JOURNAL_STREAM names stderr, else console on a "
    "terminal, else json. json: one JSON object per line. journal: the same behind a "
    "syslog priority prefix (<3> error, <4> warning, <6> info, <7> debug) for journald. "
    "console: readable lines.",
    "control_plane.url": "Where the desired revision lives: postgresql://USER@HOST/DB "
    "(the password in a pgpass file, never here), or sqlite:///PATH (relative to the "
    "working directory; four slashes for an absolute path), or http(s)://HOST:PORT: "
    "follower mode, another replica's admin address (its GET /v1/revision, verified "
    "against cache.trusted_keys).",
    "control_plane.token_file": "Follower mode: a file holding the upstream replica's "
    "admin token.",
    "control_plane.listen_url": "PostgreSQL: a direct connection for LISTEN when url goes "
    "through a transaction-pooling PgBouncer (which cannot carry LISTEN). Unset: url.",
    "control_plane.poll_interval_s": "How often the desired revision is read. Polling is "
    "the correctness path; LISTEN only makes convergence faster.",
    "control_plane.listen": "Wake the loop early with PostgreSQL LISTEN/NOTIFY (ignored "
    "for SQLite). Needs a direct or session-pooled connection, not a transaction-pooling "
    "PgBouncer.",
    "control_plane.channel": "The NOTIFY channel the publishing trigger signals.",
    "control_plane.max_revision_bytes": "A desired revision whose body is larger is "
    "refused as denied without being read.",
    "control_plane.backoff_initial_s": "The first wait after a failed attempt; it doubles "
    "(with jitter) up to backoff_max_s.",
    "control_plane.backoff_max_s": "The longest wait between failed attempts.",
    "revision.secret_env_prefixes": "Prefixes an env: secret reference must start with (empty: "
    "any variable). Anything else is refused as secret, with the same text whether or not it "
    "exists, so whoever publishes cannot make the replica hash its own environment.",
    "revision.secret_dirs": "Directories a file: secret reference must lie in, after resolving "
    "symlinks and .. (empty: anywhere). Anything else is refused as secret, with one message "
    "for missing, unreadable and outside.",
    "cache.path": "The signed last-known-good file, written after every publish and served "
    "at boot when the control plane is unreachable. Unset: no cache.",
    "cache.signing_key": "The Ed25519 key (trio-supervisor keygen) the cache is signed "
    "with. Required with cache.path.",
    "cache.serve_when_desired_refused": "When true, a boot whose desired revision does not "
    "compile serves a valid signed cache instead of exiting 3 (source last_known_good, the "
    "refusal in last_rejection, an error line every poll until desired compiles). False keeps "
    "the rule that an operator's broken intent is never hidden behind an older revision.",
    "cache.trusted_keys": "Verify keys (ed25519:...) whose signatures are accepted on the "
    "cache. Required with cache.path; must include the signing key's own verify key.",
    "snapshot.path": "Where the active snapshot is written atomically as JSON for local "
    "consumers (digests only, never secrets). Unset: not written.",
    "admin.allowed_hosts": "Host names (or .domain suffixes, or *) the admin API answers to "
    "besides its listen address and the loopback names; any other Host header gets 421, and "
    "a WebSocket from another Origin 403 (DNS rebinding, cross-site WebSockets).",
    "admin.listen": "HOST:PORT of the admin API (/healthz, /readyz, /status, /metrics, "
    "/v1/snapshot, /v1/stream). A bind failure exits 1 naming the address.",
    "admin.token_file": "A file holding the bearer token every route but /healthz "
    "requires. Required when admin.listen is not a loopback address.",
    "kubernetes.enabled": "Run the ServiceDefinition and Workflow fan-out watchers.",
    "kubernetes.kubeconfig": "Kubeconfig path. Unset: in-cluster service-account "
    "credentials.",
    "kubernetes.control_namespace": "Where the ServiceDefinition and Workflow objects are "
    "watched.",
    "kubernetes.apps_namespace": "Where their children (Deployments, Services, CronJobs) "
    "are written.",
    "kubernetes.field_manager": "The server-side apply field manager of every child write.",
    "kubernetes.preflight_retry_s": "The longest a dormant watcher waits between preflight "
    "attempts (CRDs, namespace, RBAC); retries start near 1 s and double up to it, and SIGHUP "
    "wakes a waiting preflight.",
    "kubernetes.installation": "The value of the platform.trio-supervisor.dev/installation label "
    "on every child, and part of every orphan-sweep selector, so two installations sharing an "
    "apps namespace never sweep each other's children. Unset: the control namespace.",
    "kubernetes.resync_s": "How often every parent is reconciled again even without a change "
    "(a periodic safety net; drift repair does not wait for it).",
    "kubernetes.qps": "Client-side rate limit on API requests per second (a token bucket, as "
    "client-go's QPS).",
    "kubernetes.burst": "Requests allowed at once above qps (the bucket's size, as client-go's "
    "Burst).",
    "kubernetes.leader_election": "Only the replica holding the Lease kubernetes.lease_name in "
    "the control namespace fans out; the others stand by (they converge and serve as usual) "
    "and take over when it stops renewing. false: this replica always fans out (one replica "
    "only: two would both write every child).",
    "kubernetes.lease_name": "The coordination.k8s.io/v1 Lease the replicas elect the fan-out "
    "leader on (in the control namespace; created by the first replica).",
    "kubernetes.lease_duration_s": "How long a standby waits, from the last change of the Lease "
    "it observed, before it may take over from a leader that stopped renewing.",
    "kubernetes.renew_deadline_s": "A leader that has not renewed for this long (counted from "
    "the start of its last successful renewal) stops every fan-out write; less than "
    "lease_duration_s, so it stops before anyone else may start.",
    "kubernetes.retry_period_s": "How often the leader renews and a standby tries to acquire; "
    "after a leader's clean shutdown (it releases the Lease) a standby takes over within it.",
    "kubernetes.identity": "This replica's holderIdentity in the Lease. Unset: the host name, "
    "the process id and a random suffix (unique per process).",
}

# label -> (what happened, what to do)
REASONS: Final[dict[str, tuple[str, str]]] = {
    "unavailable": ("The control plane could not be reached, or timed out.",
                    "Check the database, the network and the DSN. The replica keeps "
                    "serving and retries with backoff; at boot it serves its "
                    "last-known-good cache if one is configured."),
    "conflict": ("A serialization conflict with a concurrent writer.",
                 "Nothing: the attempt is retried."),
    "not_found": ("The desired pointer names a revision that does not exist.",
                  "Publish again (or roll back to an existing revision)."),
    "invalid": ("The store refused the request (schema missing or older?).",
                "Run trio-supervisor db migrate with this build."),
    "denied": ("Privileges refused, or the body is over "
               "[control_plane].max_revision_bytes; for the cache: signed by a key not in "
               "[cache].trusted_keys.",
               "Fix the grants, shrink the revision, or trust the signing key."),
    "corrupt": ("The body's digest does not match, or it cannot be decoded; for the "
                "cache: truncated or damaged.",
                "Publish again; inspect the storage that damaged it."),
    "incompatible": ("The revision's schema_version is newer than this build reads.",
                     "Upgrade the daemon before publishing documents of a new schema."),
    "rollback": ("Follower mode: the upstream served a validly signed revision older than "
                 "one this replica already accepted from it (a replayed response).",
                 "Check the upstream; publish a newer revision there."),
    "validation": ("The document's shape or a constraint is wrong (the detail names the "
                   "$.path).",
                   "Fix the document; trio-supervisor publish checks it before storing."),
    "projection": ("A key names an alias the document does not define.",
                   "Define the alias or remove it from the key's aliases."),
    "secret": ("A secret reference (env:NAME or file:PATH) cannot be resolved on this "
               "host.",
               "Provide the variable or file to the daemon (systemd: LoadCredential= or "
               "Environment=; Kubernetes: a Secret), then publish again or send SIGHUP."),
    "snapshot": ("The snapshot cannot be built from a compiled revision (two keys with "
                 "the same secret).",
                 "Fix the document."),
    "empty": ("Boot only: the control plane is reachable but has no desired revision.",
              "Publish one: trio-supervisor publish --config PATH FILE."),
    "cache": ("Boot only: the control plane could not serve, and the last-known-good "
              "cache was refused (damaged, unauthentic, rolled back, or from a newer "
              "format).",
              "Restore the control plane, or fix the cache (trusted keys); the detail "
              "names the cache's own reason."),
    "schema_skew": ("Fan-out: the installed CRD's schema differs from this build's.",
                    "Apply the running build's CRDs: kubectl apply -k manifests/crds."),
    "namespace_or_rbac_unready": ("Fan-out: the preflight list failed (apps namespace, "
                                  "RBAC or CRD missing, or the API server unreachable).",
                                  "kubectl apply -k manifests/apps-namespace; check the "
                                  "API server. Retried every preflight_retry_s."),
    "child_api_missing": ("Fan-out: the API server does not serve the child's group and "
                          "version (batch/v1 CronJob needs Kubernetes 1.21 or newer).",
                          "Upgrade the cluster, or disable the kind; the other kind and the "
                          "convergence loop keep working."),
}

REVISION_TABLES: Final[dict[str, str]] = {
    "RevisionDocument": "The top level: the schema version and two tables of named entries.",
    "AliasSpec": "An upstream the data plane may route to, by alias name.",
    "KeySpec": "An API key: a secret reference and the aliases it may use.",
}

REVISION_KEYS: Final[dict[str, str]] = {
    "RevisionDocument.schema_version": "The document's schema; a newer one than this build "
    "reads is refused as incompatible (and served from the cache at boot).",
    "RevisionDocument.aliases": "Alias name → `[aliases.NAME]` table.",
    "RevisionDocument.keys": "Key name → `[keys.NAME]` table.",
    "AliasSpec.upstream": "An http or https URL with a host.",
    "AliasSpec.timeout_s": "Seconds the data plane waits for the upstream.",
    "AliasSpec.retries": "Retries the data plane makes.",
    "KeySpec.secret": "`env:NAME` or `file:PATH`, resolved on the daemon's host; with "
    "`[revision]` limits where they may point (when this build has them).",
    "KeySpec.aliases": "Names of aliases defined in this document.",
}
