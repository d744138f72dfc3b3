"""The prose of the generated reference pages in ``docs/`` (see :mod:`tools.docsgen`).

Types, defaults, bounds, environment names, reason labels and log events come
from the code; what a key *means* and what to do about a label is written here,
keyed by name. A key, label, route or column missing here still gets its generated row (with
"(not described yet)"), and ``tests/unit/test_docsgen*.py`` name what is missing.

One catalogue here is not prose but a declaration: :data:`STATUS_KEYS` lists the
keys of the ``/status`` document (a plain dict today), and
``tests/unit/test_docsgen_pages.py`` holds it equal to the keys of a real document.
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
    "terminal, else json. json: one JSON object per line. journal: journald's native "
    "protocol, every key a journal field in upper case (journalctl REASON=secret), MESSAGE "
    "the JSON line; where no journal socket exists (/run/systemd/journal/socket, or "
    "$SUPERVISOR_JOURNAL_SOCKET), the JSON line on stderr behind a syslog priority prefix "
    "(<3> error, <4> warning, <6> info, <7> debug). console: readable lines.",
    "control_plane.url": "Where the desired revision lives: postgresql://USER@HOST/DB "
    "(the password in a pgpass file, never here), or sqlite:///PATH (relative to the "
    "working directory; four slashes for an absolute path), or http(s)://HOST:PORT: "
    "follower mode, another replica's admin address (its GET /v1/revision, verified "
    "against control_plane.trusted_keys).",
    "control_plane.token_file": "Follower mode: a file holding the upstream replica's "
    "admin token (as every token file: one token of printable ASCII, the file at most "
    "4096 bytes; check and a start refuse any other).",
    "control_plane.ca_file": "Follower mode over https://: the CA file the upstream's "
    "certificate is verified against (hint stream included). Unset: the system's trust store.",
    "control_plane.client_cert_file": "Follower mode over https://: the certificate (PEM "
    "chain) this follower presents when the upstream sets admin.client_ca_file. With "
    "client_key_file.",
    "control_plane.client_key_file": "The private key of control_plane.client_cert_file "
    "(mode 0600).",
    "control_plane.trusted_keys": "Follower mode, required: the root's verify keys "
    "(ed25519:...) a signed statement must carry, whichever hop passed it on. Never this "
    "replica's own cache key (check exits 2): a key that signs caches must not vouch for "
    "what the upstream sends.",
    "control_plane.root_identity": "Follower mode: the root's control-plane identity "
    "(`revision.statement.root` of its `/status`) this follower follows. Unset: the root of "
    "the first statement it accepts, pinned in `<[cache].path>.accepted`; a statement of "
    "another root is denied until `follower reset` or this key names the new one.",
    "control_plane.fetch_timeout_s": "Follower mode: one fetch of the upstream's statement "
    "(connect, headers and body) ends within this, as a whole: a slow drip is unavailable.",
    "control_plane.hint_min_interval_s": "Follower mode: any number of the upstream's stream "
    "hints within this interval cause at most one fetch.",
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
    "control_plane.read_timeout_s": "The deadline of one database call, connect and statement "
    "together (PostgreSQL: a connect within a third of it, at most 5 s; the server's "
    "statement_timeout 2 s before it). At the deadline the call's socket is shut down, so its "
    "worker thread returns.",
    "control_plane.min_read_rate_kib_s": "The slowest link a hydrate must work over: its "
    "deadline is read_timeout_s plus 1 s per this many KiB of the body.",
    "control_plane.notify_min_interval_s": "At most one notification wake-up per this many "
    "seconds, however many NOTIFYs arrive (any role that may connect may NOTIFY): sooner ones "
    "are held and covered by the next wake-up, counted in supervisor_listen_wakeups_held_total. "
    "0: every notification wakes the loop.",
    "revision.secret_env_prefixes": "Prefixes an env: secret reference must start with (empty: "
    "any variable). Anything else is refused as secret, with the same text whether or not it "
    "exists, so whoever publishes cannot make the replica hash its own environment. The "
    "variables the daemon itself reads (SUPERVISOR_*, PG*, KUBECONFIG, KUBERNETES_*, "
    "NOTIFY_SOCKET, WATCHDOG_*, JOURNAL_STREAM, SSL_CERT_*, the proxy variables, NETRC) are "
    "refused whatever this says, and a prefix that admits one is a configuration error. "
    "With neither this nor secret_dirs set, check warns (check --strict exits 2).",
    "revision.secret_dirs": "Directories a file: secret reference must lie in, after resolving "
    "symlinks and .. (empty: anywhere). Anything else is refused as secret, with one message "
    "for missing, unreadable, not a regular file, more than one hard link and outside. Never "
    "a secret, whatever this says: /proc, /sys, /dev (and a kernel filesystem mounted anywhere), "
    "the daemon's service-account directory, "
    "and every file it reads a credential from (the token files, the signing key, the "
    "kubeconfig, libpq's password file and client key, netrc, its configuration file), "
    "under any name. A file is looked at (O_PATH, fstat) before it is opened for reading: "
    "a device or a FIFO is never opened. A directory with a .. component, or one holding a "
    "credential file the configuration names, is a configuration error.",
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
    "cache.statement_ttl_s": "A root: how long the statement it signs about its desired "
    "revision stays valid (at least 1 s); it signs a fresh one after a successful read of "
    "its control plane once the one it serves is older than half of this. Followers "
    "report stale once it expires.",
    "snapshot.path": "Where the active snapshot is written atomically as JSON for local "
    "consumers (digests only, never secrets). Unset: not written.",
    "hook.command": "A program run after each swap (a list: the program and its arguments, "
    "run without a shell), with SUPERVISOR_REVISION, SUPERVISOR_SEQUENCE and "
    "SUPERVISOR_SNAPSHOT (the snapshot file's absolute path) in its environment; one run at "
    "a time, coalesced to the newest revision, retried with backoff when it fails; "
    "convergence never waits on it. Empty: no hook.",
    "hook.timeout_s": "How long one run of the hook may take (up to 3600 s): then its whole "
    "process group is killed and the run counts as `timeout`.",
    "admin.allowed_hosts": "Host names (or .domain suffixes, or *) the admin API answers to "
    "besides its listen address and the loopback names; any other Host header gets 421, and "
    "a WebSocket from another Origin 403 (DNS rebinding, cross-site WebSockets).",
    "admin.allowed_origins": "Origins (scheme://host[:port]) whose pages may open the stream "
    "or POST /v1/converge besides the listener's own (its scheme and port with a host it "
    "answers to); any other Origin gets 403, another port of localhost included.",
    "admin.tls_cert_file": "Serve HTTPS and WSS with this certificate (PEM chain; with "
    "tls_key_file). SIGHUP reloads both files: new handshakes get the new certificate.",
    "admin.tls_key_file": "The private key of admin.tls_cert_file (mode 0600).",
    "admin.client_ca_file": "With TLS: require a client certificate signed by this CA "
    "(mutual TLS between replicas); a client without one fails the handshake.",
    "admin.allow_plaintext": "Must be true for a non-loopback admin.listen without TLS "
    "(check exits 2 otherwise): tokens and revisions then cross the network in the clear.",
    "admin.read_token_file": "A second bearer token, accepted on the GET routes and the "
    "stream only; POST /v1/converge answers it 403 read_only. Give followers this one. "
    "Needs token_file, and must hold another token.",
    "admin.advertise_url": "The address (`http(s)://HOST:PORT`) this replica names itself "
    "by to its upstream on each fetch and stream, for `GET /v1/followers` and `status "
    "--fleet` (default: its listen address; a wildcard one as this host's name).",
    "admin.listen": "HOST:PORT of the admin API (/healthz, /readyz, /status, /metrics, "
    "/v1/snapshot, /v1/stream). A bind failure exits 1 naming the address.",
    "admin.token_file": "A file holding the bearer token every route but /healthz "
    "requires (one token of printable ASCII, the file at most 4096 bytes). Required when "
    "admin.listen is not a loopback address.",
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
    "kubernetes.applied_events": "Record an `Applied` Event on the parent for every child "
    "write. Off by default: the other Events (`ApplyFailed`, `Invalid`, `DriftRepaired`, "
    "`Conflict`) say what needs a look; the parent's `Ready` condition says it was applied.",
    "kubernetes.qps": "Client-side rate limit on API requests per second (a token bucket, as "
    "client-go's QPS): a safety net sized not to set the pace; the API server's own "
    "protection does (a 429's Retry-After holds every request of the client).",
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
    "rollback": ("Follower mode: the upstream served a validly signed statement whose "
                 "sequence is below the highest this replica ever accepted (kept across "
                 "restarts beside the cache), or issued before it (a replayed response).",
                 "Check the upstream; an operator's rollback at the root is a higher "
                 "sequence and is accepted."),
    "stale": ("Follower mode: the root's signed statement has expired ([cache].statement_ttl_s "
              "at the root): the root stopped reading its control plane, or a hub in between "
              "froze it; or it was issued more than 60 s ahead of this replica's clock (one of "
              "the two clocks is wrong). The active revision keeps serving.",
              "Check the root's control plane and every hop between; the root's next "
              "statement clears it."),
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
    "timeout": ("Fan-out: a list, a watch or a child write passed its deadline (no "
                "response headers within the request timeout, a body too slow, a watch "
                "silent past its inactivity bound).",
                "Check the API server's load and the network to it. Retried with backoff."),
    "server_error": ("Fan-out: the API server answered a list, watch or child write with a "
                     "5xx.", "Check the API server (and etcd). Retried with backoff."),
    "throttled": ("Fan-out: the API server answered 429 (API Priority and Fairness).",
                  "Nothing, or give the daemon's FlowSchema more share. Retried after its "
                  "Retry-After."),
    "too_large": ("Fan-out: a response body or a watch line was over its bound (64 MiB, "
                  "8 MiB) and refused unread.",
                  "Find the oversized object (a parent or child near etcd's limit); the "
                  "watch restarts, the list is retried."),
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

PAGES: Final[dict[str, str]] = {
    "configuration.md": "every configuration key: type, default, bounds, environment name, "
    "meaning.",
    "commands.md": "every subcommand and option of `trio-supervisor`, with examples and exit "
    "codes.",
    "exit-codes.md": "the process's exit codes, which errors lead to them, the signals it "
    "handles, and what it tells systemd.",
    "revision-schema.md": "the revision document `publish` takes and the daemon compiles.",
    "control-plane.md": "the control-plane tables, the NOTIFY trigger, the desired pointer's "
    "rules, follower mode, how reads fail.",
    "admin-api.md": "the admin routes, the `/status` document and the live stream's messages.",
    "metrics.md": "every Prometheus metric with its type, help and label values.",
    "kubernetes.md": "the custom resources, labels, annotations, conditions, Events and API "
    "resources of the fan-out.",
    "reasons.md": "every `reason` label, and what to do about it.",
    "log-events.md": "every log line with its level and keys.",
    "boundaries.md": "every boundary where data enters or the process waits: size, check, "
    "deadline, reason, test.",
}

SIGNALS: Final[dict[str, str]] = {
    "SIGTERM": "Graceful shutdown (`STOPPING=1` under systemd): children stop in reverse "
    "start order, all within `[supervisor].shutdown_grace_s`; exit 0. A second SIGTERM or "
    "SIGINT cancels everything at once.",
    "SIGINT": "As SIGTERM (Ctrl-C).",
    "SIGHUP": "Under systemd `RELOADING=1` first, `READY=1` when done. Re-read "
    "`[log].level` from the configuration file and run a convergence "
    "attempt now (and wake the fan-out watchers waiting in their preflight). The file is read "
    "off the event loop within 5 s (anything but a regular file is refused); every other "
    "changed key is named in one warning, `SIGHUP: restart needed for <keys>`. "
    "`[admin].token_file` and `read_token_file` are read again (`SIGHUP: tokens reloaded`): "
    "the old tokens are refused from then on, and a stream opened with one is closed (1008 "
    "`token no longer valid`); an unusable file keeps both old ones.",
}

SYSTEMD: Final[dict[str, str]] = {
    "READY": "Once the first snapshot is published and every child has started (a fan-out "
    "watcher waiting in its preflight has started: READY never waits for Kubernetes).",
    "STATUS": "On state changes: what is served, what is failing, `stopping`.",
    "STOPPING": "When shutdown begins (the first SIGTERM/SIGINT).",
    "RELOADING": "On SIGHUP once ready, before the re-read (`Type=notify-reload` waits for "
    "it); `READY=1` follows when the reload is done, its `STATUS=` saying `reloaded` or "
    "`reload failed; <why>`.",
    "MONOTONIC_USEC": "With `RELOADING=1`: `CLOCK_MONOTONIC` in microseconds when the reload "
    "began.",
    "EXTEND_TIMEOUT_USEC": "As the start begins: its own deadline to READY (one attempt on "
    "the store's deadlines and the file calls around it, each within 60 s: 355 s with the "
    "defaults), so `TimeoutStartSec` cannot kill a start that keeps within them.",
    "WATCHDOG": "Every half `WATCHDOG_USEC` (when `WATCHDOG_PID` is unset or this process) "
    "while healthy; a crash-looping tree, a restarted child stuck `starting` or a stalled "
    "loop stops it, so `WatchdogSec` restarts the process.",
}

ADMIN_ROUTES: Final[dict[str, str]] = {
    "/healthz": "200 `{\"ok\": true}` while the event loop responds and every child is "
    "alive; 503 `{\"ok\": false, \"unhealthy\": [reasons]}` when a child has failed for good, "
    "waits to restart, or was restarted and has spent longer than "
    "the stall limit, `3 * poll_interval_s + backoff_max_s` plus the store's own deadlines "
    "of one attempt (observe and the body's size at `read_timeout_s` each, the hydrate at "
    "`read_timeout_s` plus 1 s per `min_read_rate_kib_s` KiB of `max_revision_bytes`; in "
    "follower mode `fetch_timeout_s` instead: 160 s with the defaults) "
    "starting since it last ran (its restart "
    "attempts added up, backoff waits not; a first start is the boot, covered by "
    "`/readyz`), or the convergence loop has not finished an attempt for that long, or "
    "the last write of the snapshot file failed (`the snapshot file cannot be written: "
    "...`: its consumers read a file the daemon could not replace; 200 again once a write "
    "succeeds).",
    "/readyz": "200 `{\"ready\": true, \"revision\", \"generation\"}` once a snapshot is "
    "active; 503 `{\"ready\": false, \"reason\", \"consecutive_failures\"}` otherwise.",
    "/status": "200, the status document (below).",
    "/metrics": "200, Prometheus text exposition, or OpenMetrics when `Accept` asks for it "
    "([metrics.md](metrics.md)).",
    "/v1/snapshot": "200, the active snapshot as JSON `{\"revision\", \"generation\", "
    "\"aliases\", \"keys\"}` (each key's SHA-256, never the secret) with "
    "`ETag: \"<revision>-<generation>\"`; 304 when `If-None-Match` names it; 503 when none "
    "is active.",
    "/v1/revision": "200, the active revision's signed statement in the last-known-good file "
    "format, version 2 (a root: the bytes `[cache]` writes; a follower: the root's bytes, "
    "unchanged), `ETag: \"<sequence>.<sha256 prefix>.<issued_at in us>\"` (it changes with "
    "the sequence, the body and every re-signing); 304 on `If-None-Match`; 503 when none is "
    "active, no signing key is configured, or the cache does not hold it yet. What followers "
    "poll.",
    "/v1/followers": "200 `{\"followers\": [{\"url\", \"sequence\", \"etag\", "
    "\"state\", \"reason\", \"last_seen\"}]}`: the direct followers as their last fetch or "
    "stream named them (state `converged`, `converging`, `refusing` or `stale`), each "
    "forgotten after 3 "
    "of its poll intervals, at most 256 (a new one past that replaces the one seen longest "
    "ago). The read token is enough. What `status --fleet` walks.",
    "/v1/stream": "The live stream (WebSocket, below); a plain GET answers 426.",
    "/v1/converge": "Runs a convergence attempt now and answers when it has finished: "
    "200 `{\"outcome\", \"revision\", \"reason\"}` (outcome `published`, `converged`, "
    "`empty`, `rejected` or `failed`; an unreachable control plane is `failed`, not an HTTP "
    "error); 504 when none finished within `?timeout_s=` (default 60, at most 300).",
}

# The /status document's keys, by dotted path (<name>: a child, <kind>: a fan-out kind).
STATUS_KEYS: Final[dict[str, str]] = {
    "revision": "What this replica converges: the revisions and the last attempts.",
    "revision.desired": "The revision the control plane last said is desired (null: never "
    "read).",
    "revision.loaded": "The last revision that compiled (a refused candidate never shows "
    "here).",
    "revision.active": "The revision of the snapshot serving now (null: none).",
    "revision.generation": "Counts the snapshots published since start.",
    "revision.source": "`control_plane`, `last_known_good`, null (nothing serving), or in "
    "follower mode the upstream's address.",
    "revision.lag_s": "Seconds since desired first differed from active (0.0 when equal).",
    "revision.last_convergence_s": "Duration of the last successful publish.",
    "revision.consecutive_failures": "Failed attempts since the last success.",
    "revision.last_rejection": "The last refusal `{\"revision\", \"reason\", \"detail\", "
    "\"at\"}`, null until one happens (an unreachable control plane is an outage, not a "
    "refusal).",
    "revision.control_plane_up": "The control plane answered the last read, a refusal "
    "included (a revoked grant, a lock); false only when it could not be asked (null before "
    "the first).",
    "revision.last_error": "The last failed attempt as `<reason>: <detail>`, null once one "
    "succeeds.",
    "revision.sequence": "The root's desired-state sequence of what serves (grows at every "
    "change of desired state, rollbacks included; null: unknown).",
    "revision.statement": "The signed statement serving: `{\"sequence\", \"root\", "
    "\"issued_at\", \"expires_at\", \"age_s\", \"stale\"}` (`root`: the root's "
    "control-plane identity; `stale`: expired), null without one.",
    "revision.statement_age_s": "Seconds since the root issued the statement serving (null "
    "without one): a root that stopped signing shows here on every follower below it; "
    "`lag_s` stays the divergence time (0 when converged).",
    "revision.upstream": "Follower mode only: the upstream replica's address.",
    "children": "The supervised children, by name.",
    "children.<name>.state": "`starting`, `running`, `backoff`, `stopped` or `failed`; "
    "`reconnecting` is a running child's own word on itself: the `listen` child "
    "(LISTEN, or a follower's stream of its upstream) retrying its connection after a "
    "failed connect or a lost connection (wake-ups "
    "come from the poll alone meanwhile; not unhealthy, the tree does not restart it).",
    "children.<name>.restarts": "Restarts since start.",
    "children.<name>.last_error": "Why it last crashed (null: never).",
    "fanout": "The fan-out watchers, by kind (empty when `[kubernetes].enabled` is false).",
    "fanout.<kind>.state": "`disabled`, `preflight` (waiting for the CRD, namespace or RBAC, "
    "a list or watch being retried after a failure, or between two watches: the server "
    "ended one, e.g. at its `timeoutSeconds`, and the next one's headers have not come) or "
    "`watching` (every watch of the kind open).",
    "fanout.<kind>.last_error_class": "Why the preflight, a list or watch, or the child writes "
    "of some parent last failed while that lasts (null, or a fan-out label of "
    "[reasons.md](reasons.md)).",
    "fanout.<kind>.objects": "Parent objects currently known.",
    "fanout.<kind>.skewed": "Only when there are some: parents (up to 20) that do not decode "
    "and are skipped.",
    "leadership": "The fan-out leader election (README \"High availability\").",
    "leadership.role": "`leader` (this replica fans out), `standby` (another replica, or "
    "nobody yet, holds the Lease; a standby's kinds report `preflight`), or `disabled` "
    "(no Kubernetes, or `[kubernetes].leader_election = false`).",
    "leadership.holder": "The Lease's holder identity as last observed (null: free, or "
    "disabled).",
    "leadership.lease": "`<namespace>/<name>` of the election Lease (null when disabled).",
    "sinks": "The side sinks that follow the active snapshot. Serving never waits on them; a "
    "refused write is retried every poll.",
    "sinks.cache": "The last-known-good cache: `ok`, `failing` (from a refused write until a "
    "write succeeds; `GET /v1/revision` answers 503 meanwhile), or `disabled` (no "
    "`[cache].path`).",
    "sinks.snapshot_file": "The snapshot file (`[snapshot].path`): `ok`, `failing` or "
    "`disabled`, as for the cache.",
    "sinks.cache_error": "Why the cache's last write was refused (null unless failing).",
    "sinks.snapshot_file_error": "Why the snapshot file's last write was refused (null "
    "unless failing).",
    "sinks.hook": "The reload hook (`[hook].command`; null without one): `state` (`ok`, or "
    "`failing` from a failed run until a run succeeds), `running` (a run in progress), and "
    "its last finished run: `revision` and `sequence` (what it was told), `outcome` (`ok`, "
    "`failed`: a non-zero exit or a signal, `timeout`: its process group killed at "
    "`[hook].timeout_s`, `error`: it could not be started), `exit_code` (negative: the "
    "signal that ended it), `duration_s`, `output` (its first 4 KiB, stdout and stderr "
    "together), `finished_at` (UTC, ISO 8601).",
    "version": "The build of trio-supervisor serving (as `trio-supervisor --version`): an "
    "upgrade's progress across the fleet (`status --url A --url B`, column VERSION).",
    "started_at": "When this process started (UTC, ISO 8601): a restart shows here.",
    "threads_past_deadline": "Per dependency (`database`, `files`, `reload`, `kube`, `cpu`), "
    "the worker threads still running after their caller gave up at a deadline; empty when "
    "none. A count that stays above 0 names a dependency that is stuck.",
}

CONTROL_PLANE_TABLES: Final[dict[str, str]] = {
    "supervisor_revisions": "Immutable revision documents; a revision is never updated, "
    "only pointed at (or pruned).",
    "supervisor_desired": "The one-row pointer to the revision every replica should serve.",
    "supervisor_desired_log": "One row per change of the pointer: when, by whom and why "
    "(`history` prints them, newest first). No foreign key: pruning a revision keeps the "
    "record.",
}

CONTROL_PLANE_COLUMNS: Final[dict[str, str]] = {
    "supervisor_revisions.id": "The revision id replicas report.",
    "supervisor_revisions.schema_version": "The document's schema; a newer one than a build "
    "reads is refused as `incompatible`.",
    "supervisor_revisions.body": "The UTF-8 JSON of the revision document "
    "([revision-schema.md](revision-schema.md)).",
    "supervisor_revisions.body_sha256": "SHA-256 of `body`, written by the publisher and "
    "verified by every reader (`corrupt` when it differs).",
    "supervisor_revisions.created_at": "When it was stored (UTC).",
    "supervisor_revisions.message": "The publisher's note (`publish --message`).",
    "supervisor_desired.singleton": "Always true: at most one row; publishers upsert it with "
    "`ON CONFLICT (singleton)`.",
    "supervisor_desired.revision_id": "The desired revision.",
    "supervisor_desired.updated_at": "When the pointer last moved.",
    "supervisor_desired.sequence": "Counts the changes of the pointer (publish, rollback, "
    "plain SQL), set by a trigger, never lowered: the root's intent that followers compare "
    "(a rollback is an older id under a higher sequence).",
    "supervisor_desired_log.sequence": "The pointer's `sequence` after this change.",
    "supervisor_desired_log.revision_id": "The revision the change pointed desired at.",
    "supervisor_desired_log.changed_at": "When (UTC).",
    "supervisor_desired_log.changed_by": "PostgreSQL: the role that logged in "
    "(session_user), `@` the client "
    "address when over TCP. SQLite: the OS user of the CLI, or `sql` for a plain-SQL writer.",
    "supervisor_desired_log.message": "Why: the `publish --message` or `rollback --message` "
    "text (PostgreSQL: the transaction-local setting `supervisor.change_message`).",
}

POINTER_RULES: Final[tuple[str, ...]] = (
    "Publishing is one transaction: insert a revision, point `supervisor_desired` at it, "
    "commit. Anyone may do it with plain SQL; `trio-supervisor publish` computes the digest "
    "and refuses (nothing stored) a body over `max_revision_bytes` or a `schema_version` "
    "this build does not read.",
    "`rollback REV` points desired at an existing revision in one statement that succeeds "
    "only if REV still exists with the body that was checked; no new body is stored.",
    "`db prune --keep N` deletes every revision older than the newest N in one transaction, "
    "never the desired one.",
    "Replicas read the pointer cheaply every `poll_interval_s` (and on NOTIFY), then the "
    "whole revision in one consistent read when it moved. A revision is the same only with "
    "the same id and the same `body_sha256` (after a restore an id may name another body).",
    "Checks on the read, in this order, before the body is decoded: the pointer names a "
    "missing revision (`not_found`); the body is over `max_revision_bytes` (`denied`); its "
    "`schema_version` is newer than the build reads (`incompatible`); its digest differs "
    "(`corrupt`). A refused candidate never replaces the active snapshot.",
)

FOLLOWER: Final[tuple[str, ...]] = (
    "A replica whose `[control_plane].url` is another replica's admin address "
    "(`http(s)://HOST:PORT`) takes its desired revision from that replica instead of a "
    "database; `[control_plane].token_file` holds the upstream's admin token.",
    "Polling the upstream's `GET /v1/revision` every `poll_interval_s` is the correctness "
    "path; its `/v1/stream` only wakes the follower early ([admin-api.md](admin-api.md)).",
    "Every statement received is judged before its revision is compiled, in this order: "
    "its signature against `[control_plane].trusted_keys` (else `denied`); issued at "
    "most 60 s ahead of this replica's clock (else `stale`: a root whose clock "
    "ran ahead would otherwise set a highest that refuses its corrected refreshes, "
    "and look fresh, until that moment); its sequence "
    "not below the highest ever accepted, kept in `<[cache].path>.accepted` across "
    "restarts and crashes (deleted, it is restored from the statement passed on, "
    "`<[cache].path>.upstream`) (else `rollback`); the same sequence with another body "
    "`corrupt`; not expired (else `stale`, checked at every poll, a 304 included). A root "
    "identity change (the root's control plane restored) is accepted only for a statement "
    "issued after the highest accepted one. Then it is compiled with this replica's own "
    "secrets, as one read from the database, and once it serves, the root's signed bytes "
    "are passed on unchanged.",
    "At boot, a refused statement (`rollback`, `denied`, `stale`, `corrupt`) boots from "
    "this replica's own valid signed cache, as an unreachable upstream does.",
    "Fetch bounds: `[control_plane].fetch_timeout_s` for one attempt as a whole; "
    "`Accept-Encoding: identity` (any other `Content-Encoding` is `corrupt`); the body "
    "bound checked while it arrives (`denied`); at most 4 KiB of a non-200 body read; a "
    "malformed header `invalid`; proxies from the environment ignored.",
    "Failures: connection errors, timeouts and 5xx (503: the upstream has nothing active "
    "yet, or no signing key) are `unavailable`, retried while the last good snapshot keeps "
    "serving; 401/403 are `denied`; any other status `invalid`.",
    "A follower has no control plane of its own: `publish`, `history`, `show`, `rollback` "
    "and `db` refuse it (`invalid`). A follower can itself be followed, so replicas form a "
    "tree.",
    "The fleet view: each fetch and stream names the follower to its upstream in "
    "`X-Supervisor-Follower-*` headers (`url`: `[admin].advertise_url` else its listen "
    "address; the `sequence` and `etag` it serves; `state` `converged`, `converging`, "
    "`refusing` or "
    "`stale`; the `reason`; its `poll-interval-s`), each bounded and checked where it "
    "enters; every replica lists its direct followers on `GET /v1/followers`. "
    "`trio-supervisor status --fleet --url ROOT` walks the tree from the root (one row a "
    "replica: depth, URL, sequence, state, reason, lag), following only a replica that "
    "serves a statement of the root's identity and key, verified with the keys of "
    "`--config` when it names any; it refuses cycles, stops at depth 8 and 64 followers a "
    "replica (256 in all), and gives each hop 5 s. `publish --wait --fleet` waits for every "
    "replica the walk finds.",
)

FAILURE_CATEGORIES: Final[dict[str, str]] = {
    "UNAVAILABLE": "Connection failure, timeout, cancelled statement.",
    "CONFLICT": "Serialization failure, deadlock, lock contention.",
    "NOT_FOUND": "Desired points at a missing revision.",
    "INVALID": "Schema not migrated (run `db migrate`), malformed request or URL.",
    "DENIED": "Privileges; a body over `max_revision_bytes`; a `schema_version` newer than "
    "this build reads (reason `incompatible`).",
    "CORRUPT": "Body digest mismatch; damaged storage (PostgreSQL SQLSTATE class XX, SQLite "
    "CORRUPT/NOTADB).",
}

KUBE_KEYS: Final[dict[str, str]] = {
    "platform.trio-supervisor.dev/applied-digest": "Annotation on every child: the digest of "
    "what was last applied, so an unchanged child is not written again.",
}

KUBE_CONDITIONS: Final[dict[str, str]] = {
    "Ready": "`True` (reason `Applied`) when every child was applied for the observed "
    "generation; `False` otherwise, with reason `Conflict` (an object of a child's name that "
    "is not ours, named with its owner labels, or a field another manager applied: left as it "
    "is, looked at again on every resync), `Invalid`, `ApplyFailed`, or "
    "`RepairDeferred` while the repair of a child that keeps drifting right after each repair "
    "waits (the message names the child and the UTC time its repair is retried).",
    "Available": "`True` (reason `ChildrenAvailable`) when every Deployment child has its "
    "desired replicas available and every other child exists; `False` "
    "(`ChildrenUnavailable`, the message naming the first child that is not) otherwise.",
}
