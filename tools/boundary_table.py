"""The table of every boundary where data enters the daemon, or the daemon waits on one.

:data:`BOUNDARIES` holds one :class:`Boundary` a row; ``docs/boundaries.md`` is rendered from it.
Each row names the test that proves it; tests/unit/test_boundaries.py checks the test exists.
The bounds are the named modules' constants, used through :mod:`supervisor.bounds` and
:mod:`supervisor.threads`.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["BOUNDARIES", "Boundary"]


class Boundary(msgspec.Struct, frozen=True, kw_only=True):
    #: Where it enters: a module and the call, query or route.
    where: str
    #: What enters: columns, a file, a header, a frame.
    enters: str
    #: Its size bound, or ``-`` where its size is fixed by its type.
    size: str
    #: Its range or shape check.
    check: str
    #: How long the process waits for it, or ``-`` where nothing waits.
    deadline: str = "-"
    #: What the deadline releases (a thread, a socket, a task).
    released: str = "-"
    #: The reason label a refusal carries (docs/reasons.md).
    reason: str
    #: The pytest node id that proves the bound.
    test: str


ADMIN: Final = (
    Boundary(
        where="supervisor.admin.http11: a request's head",
        enters="request line and headers", size="16 KiB (MAX_HEAD_BYTES)",
        check="h11 parses it; Host, Origin and the token checked before any route",
        deadline="the head within the connection's read deadline", released="the connection",
        reason="431/400",
        test="tests/integration/test_admin_http.py::"
             "test_oversized_heads_and_bodies_are_refused_and_end_their_connection"),
    Boundary(
        where="supervisor.admin.http11: a request's body (POST /v1/converge)",
        enters="the body", size="64 KiB (MAX_BODY_BYTES)", check="refused before it is read whole",
        deadline="the body within the connection's read deadline", released="the connection",
        reason="413",
        test="tests/integration/test_admin_http.py::"
             "test_oversized_heads_and_bodies_are_refused_and_end_their_connection"),
)

_KUBE_CLIENT = "tests/integration/test_kube_client.py::"
_FANOUT_FAULTS = "tests/integration/test_fanout_failures_show.py::"
KUBERNETES: Final = (
    Boundary(
        where="supervisor.kube.client: every request's response head (list, get, write, "
              "Lease, Event, watch)",
        enters="status line and headers", size="100 KiB (httpcore's h11 head limit)",
        check="a status >= 400 is our ApiError (kube.errors), 401 re-read once",
        deadline="the headers within [kubernetes] request timeout_s [10] (a trio deadline "
                 "around the send; a watch's too)",
        released="the request and its connection (httpx closes it)", reason="timeout",
        test=_KUBE_CLIENT
        + "test_a_watch_whose_headers_never_come_times_out_at_the_request_timeout"),
    Boundary(
        where="supervisor.kube.wire.ResponseBody: a list, get or write answer",
        enters="the JSON body", size="64 MiB (MAX_RESPONSE_BYTES), refused unread past it",
        check="msgspec decode into the caller's Struct (schema skew named by its $.path)",
        deadline="timeout_s plus 1 s per 256 KiB read (MIN_BODY_RATE); each silence "
                 "timeout_s (httpx)",
        released="the connection", reason="too_large",
        test=_KUBE_CLIENT + "test_a_body_over_its_bound_is_refused_before_it_is_read_whole"),
    Boundary(
        where="supervisor.kube.wire.raise_api_error: an error answer",
        enters="its Status body", size="64 KiB read (MAX_ERROR_BODY_BYTES), the rest dropped",
        check="reason cut to 128 bytes, message to 1 KiB (bounds.cut)",
        deadline="as a body", released="the connection", reason="server_error",
        test=_KUBE_CLIENT + "test_a_body_over_its_bound_is_refused_before_it_is_read_whole"),
    Boundary(
        where="supervisor.kube.wire.retry_after: a 429's Retry-After",
        enters="a header (seconds or an HTTP date)", size="-",
        check="finite, 0..30 s (MAX_RETRY_AFTER_S)", reason="throttled",
        test=_KUBE_CLIENT + "test_a_huge_retry_after_is_capped_in_the_error_too"),
    Boundary(
        where="supervisor.kube.watching.Informer: a watch of parents or children",
        enters="the watch's response head", size="100 KiB (httpcore's h11 head limit)",
        check="as every request; the kind is not watching until every watch opened",
        deadline="timeout_s [10], then retried after a backoff of 0.8 s doubling to 30 s",
        released="the request; /status shows preflight and timeout meanwhile",
        reason="timeout",
        test=_FANOUT_FAULTS + "test_a_watch_whose_headers_never_come_is_retried_and_shows"),
    Boundary(
        where="supervisor.kube.watching.Informer: a list of parents or children (paged, 500)",
        enters="one page", size="64 MiB (a body)", check="each item decoded on its own; a "
        "skewed one named and skipped",
        deadline="as a body; a failed list retried after the backoff",
        released="the request; /status shows preflight and the class meanwhile",
        reason="timeout",
        test=_FANOUT_FAULTS + "test_a_list_that_never_answers_is_retried_and_shows"),
    Boundary(
        where="supervisor.kube.wire.WatchStream: one watch line",
        enters="one JSON event", size="8 MiB (MAX_WATCH_LINE_BYTES), checked as it grows",
        check="Informer.handle_line: an event, or a refusal with a fan-out reason",
        deadline="each line within inactivity_s [120] (bookmarks keep a healthy one talking)",
        released="the stream, re-watched from its resourceVersion", reason="too_large",
        test=_FANOUT_FAULTS + "test_a_watch_line_over_its_bound_restarts_the_watch_and_shows"),
    Boundary(
        where="supervisor.kube.watching.Informer.handle_line: any bytes of a line",
        enters="type, object, metadata, an ERROR event's Status", size="one line (above)",
        check="msgspec types; resourceVersions compared only as integers",
        reason="schema_skew",
        test="tests/unit/test_watch_lines.py::"
             "test_any_watch_line_is_an_event_or_a_refusal_with_a_reason"),
    Boundary(
        where="supervisor.kube.wire.WatchStream: a watch gone silent",
        enters="nothing (a half-open connection)", size="-", check="-",
        deadline="inactivity_s [120] without a byte", released="the stream, re-watched",
        reason="timeout",
        test="tests/integration/test_fanout_watchers.py::test_a_stalled_stream_is_detected"),
    Boundary(
        where="supervisor.fanout.childwrites: a child's create, apply or delete",
        enters="the object returned", size="64 MiB (a body)", check="a map; 5xx, timeouts "
        "and 429 requeued per parent (0.8 s doubling to 30 s)",
        deadline="as every request", released="the worker, for the next parent",
        reason="server_error",
        test=_FANOUT_FAULTS + "test_child_writes_failing_show_and_are_logged_once_per_parent"),
    Boundary(
        where="supervisor.fanout.leadership: the Lease's get, create and update",
        enters="the Lease", size="64 MiB (a body)", check="a coordination.k8s.io/v1 Lease "
        "we can write back, else a bad lease",
        deadline="renew_deadline_s for each renewal (and as every request)",
        released="the fan-out's writes, stopped before the lease expires",
        reason="timeout",
        test="tests/unit/test_leadership.py::test_lose_by_deadline_stops_writes_before_expiry"),
    Boundary(
        where="supervisor.kube.config.load_settings_async: the kubeconfig or service account",
        enters="the configuration, its files, an exec plugin's token",
        size="not bounded here: the official loader reads them",
        check="the loader's; any failure is KubeConfigError, retried at the next request",
        deadline="30 s (CREDENTIALS_DEADLINE_S) on the kube thread limit (THREAD_LIMITS)",
        released="the caller (the thread, abandoned, gives its token back when it ends)",
        reason="namespace_or_rbac_unready",
        test=_KUBE_CLIENT
        + "test_a_hung_exec_plugin_ends_at_its_deadline_on_the_clients_own_threads"),
)

_PG = "tests/integration/test_store_postgres.py::"
_LIFE = "tests/integration/test_store_lifecycle.py::"

DATABASE: Final = (
    Boundary(
        where="supervisor.controlplane.checks: observe_sql (every poll and wake-up)",
        enters="supervisor_desired.revision_id, sequence; supervisor_revisions.body_sha256;"
               " max(supervisor_schema_migrations.version)",
        size="- (integers and a 32-byte digest: CHECK octet_length = 32)",
        check="id >= 1, sequence >= 0 (else malformed); schema not newer than the build",
        deadline="the store's statement deadline", released="the call's thread and connection",
        reason="malformed/invalid",
        test="tests/integration/test_db_migrate.py::"
             "test_a_schema_migrated_ahead_is_refused_at_the_next_observe"),
    Boundary(
        where="supervisor.convergence.loop: observe decides",
        enters="a wake-up (NOTIFY, hint, POST /v1/converge)", size="one observe row",
        check="the active id and digest seen again: no hydrate",
        reason="-",
        test="tests/integration/test_listen_process.py::"
             "test_notifications_against_an_unchanged_large_revision_cost_no_more_than_a_small_one"),
    Boundary(
        where="supervisor.controlplane.checks: hydrate_sql",
        enters="supervisor_revisions.body", size="[control_plane].max_revision_bytes (withheld"
               " in SQL above it)",
        check="size, then schema_version, then SHA-256 against body_sha256 (the one hash)",
        deadline="the store's statement deadline", released="the call's thread and connection",
        reason="too_large/incompatible/corrupt",
        test=_PG + "test_oversize_body_is_too_large_on_publish_and_on_hydrate"),
    Boundary(
        where="supervisor.controlplane.checks: message_columns (revision, history); hydrate "
              "does not read it",
        enters="supervisor_revisions.message (SQLite: created_at too)",
        size="4 KiB (MESSAGE_BYTES: left/substr in SQL, and its length)",
        check="cut and marked with the full length (bounds.cut_read), never refused",
        reason="-",
        test="tests/integration/test_memory_process.py::"
             "test_a_huge_message_is_read_cut_and_costs_the_daemon_no_memory"),
    Boundary(
        where="supervisor.controlplane.revisions: revision and history",
        enters="supervisor_revisions.message", size="4 KiB (MESSAGE_BYTES)",
        check="cut and marked (bounds.cut_read)", reason="-",
        test=_LIFE + "test_a_long_message_is_read_cut_to_4_kib_and_marked"),
    Boundary(
        where="migrations 0003: supervisor_desired_log and supervisor_desired",
        enters="a change record row; the desired sequence", size="- (bigint)",
        check="+1 from the record, at most 2^62; the log written only by the trigger",
        reason="invalid",
        test="tests/integration/test_desired_sequence.py::"
             "test_the_log_takes_rows_only_from_the_trigger_and_sequences_stay_below_2_62"),
    Boundary(
        where="supervisor.controlplane.listen: a NOTIFY",
        enters="the notification (channel, payload)", size="- (PostgreSQL: under 8000 bytes)",
        check="the payload is never used (logged cut to 32 characters); wake-ups floored",
        reason="-",
        test="tests/integration/test_listen_process.py::"
             "test_a_notify_storm_by_a_role_without_privileges_is_floored"),
    Boundary(
        where="supervisor.convergence.status: last_error, last_rejection; /status; stream frames",
        enters="a refusal's detail (names from a revision)", size="1 KiB a detail (bounds.cut)",
        check="cut where the loop records it; /status under 64 KiB",
        reason="-",
        test="tests/integration/test_refusal_texts_process.py::"
             "test_a_15_mib_alias_name_leaves_status_the_log_and_the_stream_bounded"),
    Boundary(
        where="supervisor.revision (document, compile, secrets): a refusal's detail",
        enters="names from a revision: alias and key names, unknown fields, secret "
               "references and their paths",
        size="a name 128 bytes (NAME_BYTES), a path 512 (PATH_BYTES)",
        check="quoted with escapes and cut where the detail is built (bounds.quoted, "
              "bounds.shown; a plain one as written)",
        reason="validation/projection/secret/snapshot",
        test="tests/unit/test_revision_refusals.py::"
             "test_a_hostile_name_is_quoted_and_bounded_in_the_refusal"),
)

CONFIGURATION: Final = (
    Boundary(
        where="supervisor.tokenfile.read_token: [admin].token_file, read_token_file, "
              "[control_plane].token_file, --token-file",
        enters="a bearer token file, and its path",
        size="4 KiB (MAX_TOKEN_FILE_BYTES: one byte more read); the path shown in 512 bytes "
             "(PATH_BYTES)",
        check="UTF-8, one token of printable ASCII; a path holding a NUL or no bytes is "
              "unreadable",
        reason="exit 2 (ConfigError)",
        test="tests/unit/test_tokenfile.py::"
             "test_any_file_gives_one_printable_token_or_a_configuration_error"),
    Boundary(
        where="supervisor.dsn.problem: [control_plane].url, listen_url (PostgreSQL)",
        enters="the DSN", size="the configuration's bound (1 MiB); a parameter named in "
                               "128 bytes (NAME_BYTES)",
        check="libpq's own parser (a lone surrogate: unparseable); the password read as "
              "spelled; never echoed",
        reason="exit 2 (ConfigError)",
        test="tests/unit/test_dsn.py::"
             "test_any_dsn_is_judged_with_a_bounded_reason_and_never_raises"),
)

FLEET: Final = (
    Boundary(
        where="supervisor.controlplane.replica_name.parse: GET /v1/revision and the stream "
              "handshake (supervisor.admin.fleet.Followers.note)",
        enters="a follower's X-Supervisor-Follower-* headers",
        size="url 512, etag 128, reason 32 bytes; at most 256 followers held (MAX_FOLLOWERS)",
        check="http(s) URL of printable ASCII, no credentials; sequence 0..2^62; state "
              "converged/converging/refusing/stale; poll interval 0.01 s and up, capped at "
              "3600 s; a malformed name ignored",
        deadline="forgotten after 3 of the follower's poll intervals",
        released="its row", reason="-",
        test="tests/unit/test_followers_registry.py::"
             "test_a_malformed_name_is_refused_where_it_enters"),
    Boundary(
        where="supervisor.admin.fleet.Followers.seen: the followers table",
        enters="a new follower URL", size="256 rows (MAX_FOLLOWERS)",
        check="past the bound, the row seen longest ago is replaced",
        reason="-",
        test="tests/integration/test_fleet_hostile_follower.py::"
             "test_a_hostile_follower_advertising_a_cycle_and_a_huge_list"),
    Boundary(
        where="supervisor.commands.fleet.walk: each replica's /status, /v1/revision head "
              "and /v1/followers",
        enters="a replica's answers to the fleet walk",
        size="/status 16 MiB, the statement's head 64 KiB, /v1/followers 1 MiB; 64 "
             "followers a replica, depth 8, 256 replicas",
        check="followed only when it serves the root's statement (root identity, key id, "
              "sequence not above; the signature with --config's keys); a URL seen before "
              "is a cycle, not walked",
        deadline="5 s a hop (HOP_TIMEOUT_S), 16 hops at once",
        released="the hop's connections", reason="unavailable/denied/corrupt",
        test="tests/integration/test_fleet_hostile_follower.py::"
             "test_a_hostile_follower_advertising_a_cycle_and_a_huge_list"),
    Boundary(
        where="supervisor.commands.fleet._ask and supervisor.admin.client: a replica's row",
        enters="what a replica's /status or error answer says of itself",
        size="an error answer's detail 512 bytes (bounds.cut)",
        check="a reason that is no label is corrupt, the value quoted in the detail; a lag "
              "that is no finite number is none; a lone surrogate shown as its escape",
        reason="corrupt",
        test="tests/integration/test_fleet_hostile_follower.py::"
             "test_a_replica_saying_a_hostile_reason_is_listed_with_a_bounded_one"),
)

COMMANDS: Final = (
    Boundary(
        where="supervisor.commands.publish.read_input: publish FILE",
        enters="the revision document file",
        size="[control_plane].max_revision_bytes (fstat before any read; read_capped after)",
        check="a regular file only, opened O_NONBLOCK (a FIFO, a device, a directory refused "
              "at once, naming it); then TOML or JSON by revision.document",
        reason="denied (too large), invalid (not a regular file), corrupt/validation",
        test="tests/integration/test_publish_options.py::"
             "test_publish_refuses_a_file_over_max_revision_bytes_before_reading_it"),
    Boundary(
        where="supervisor.commands.publish.read_input: publish FILE (not a regular file)",
        enters="a FIFO, a character device, a directory", size="nothing is read",
        check="fstat of the descriptor opened O_NONBLOCK: never blocks on a FIFO without "
              "a writer",
        reason="invalid",
        test="tests/integration/test_publish_options.py::"
             "test_publish_refuses_what_is_not_a_regular_file_without_blocking"),
    Boundary(
        where="supervisor.commands.publish.read_input: publish -",
        enters="standard input", size="[control_plane].max_revision_bytes (read_capped)",
        check="refused at the first byte past the bound, then as a file",
        reason="denied",
        test="tests/integration/test_publish_options.py::"
             "test_publish_dash_refuses_standard_input_past_the_bound"),
    Boundary(
        where="supervisor.commands.common.probe_schema: publish, rollback, db prune, check",
        enters="the control plane's schema version (one integer)", size="-",
        check="equal to this build's latest migration before any write (older: db migrate; "
              "newer: SchemaTooNew)",
        deadline="2 s (SCHEMA_PROBE_S)", released="the worker thread (abandoned)",
        reason="invalid",
        test="tests/integration/test_db_migrate.py::"
             "test_a_schema_older_than_the_build_is_refused_before_any_write"),
    Boundary(
        where="supervisor.completion.revision_ids: completion --revision-ids",
        enters="the newest revision ids (history)", size="50 ids (REVISION_IDS)",
        check="none: printed as integers; any failure prints nothing",
        deadline="2 s (REVISION_IDS_S)", released="the store's call",
        reason="-",
        test="tests/integration/test_completion.py::"
             "test_bash_completes_revision_ids_from_the_configured_store"),
)

_PROPS: Final = "tests/unit/test_statement_properties.py::"
_STORE: Final = "tests/unit/test_follower_store.py::"

FOLLOWER: Final = (
    Boundary(
        where="supervisor.sinks.lkg.fileformat.decode_file: a cache file or an upstream's "
              "statement", enters="the framing, the signed header, the body",
        size="header 64 KiB (MAX_HEADER_BYTES); body max_revision_bytes",
        check="magic, length prefix, Ed25519 signature before any field is believed, then "
              "each field's type (msgspec), the body's length and SHA-256",
        reason="corrupt/denied/incompatible",
        test=_PROPS + "test_any_bytes_are_refused_with_a_reason"),
    Boundary(
        where="supervisor.sinks.lkg.fileformat.decode_file: statement fields",
        enters="revision, sequence, root, key_id, created_at", size="root 512 characters",
        check="revision and sequence non-negative, sequence at most 2^62, times with an "
              "offset, created_at convertible to UTC",
        reason="corrupt",
        test=_PROPS + "test_any_signed_field_values_are_judged_without_another_exception"),
    Boundary(
        where="supervisor.sinks.lkg.statement.utc_times: statement times",
        enters="issued_at, expires_at", size="-",
        check="converted to UTC inside years 2000..9998; expires_at - issued_at in "
              "0..30 days (check_range)",
        reason="corrupt",
        test="tests/integration/test_follower_statement_times.py::"
             "test_a_signed_statement_with_times_out_of_range_is_corrupt_and_serving_goes_on"),
    Boundary(
        where="supervisor.sinks.lkg.accepted.refusal_of: the statement's root and sequence",
        enters="root identity, sequence, body digest", size="-",
        check="the pinned root (or [control_plane].root_identity), the sequence accepted, one "
              "body per sequence",
        reason="denied/rollback/corrupt",
        test="tests/integration/test_follower_root_pinning.py::"
             "test_a_restored_copy_of_the_root_cannot_move_the_follower_until_it_is_reset"),
    Boundary(
        where="supervisor.sinks.lkg.accepted.AcceptedStatements: <[cache].path>.accepted",
        enters="the accepted statement or a reset record", size="4 KiB (_MAX_BYTES)",
        check="a regular file (O_NOFOLLOW, fstat), msgspec with unknown fields refused, times "
              "as the statement's",
        reason="exit 2 (ConfigError)",
        test=_PROPS + "test_any_accepted_file_is_read_or_refused_as_a_configuration_error"),
    Boundary(
        where="supervisor.controlplane.follower: GET /v1/revision's answer",
        enters="status, ETag, Content-Encoding, body",
        size="body max_revision_bytes + framing, counted as it arrives; a non-200 body "
             "4 KiB; ETag 256 characters",
        check="200/304 only; ETag printable ASCII; identity encoding only",
        deadline="[control_plane].fetch_timeout_s for connect, headers and body",
        released="the connection",
        reason="denied/corrupt/invalid/unavailable",
        test=_STORE + "test_a_body_past_the_bound_is_refused_while_it_arrives"),
    Boundary(
        where="supervisor.admin.signed.not_modified: a follower's If-None-Match",
        enters="ETags naming sequence, digest and issued_at",
        size="the request head's bound (16 KiB)",
        check="one reading of the list (responses.entity_tags); a regular expression matched "
              "whole per tag: digits and 32 hex digits only",
        reason="304/200",
        test="tests/unit/test_admin_revision.py::"
             "test_any_if_none_match_is_a_304_only_for_this_statement_or_a_later_issue_of_it"),
)

HOOK: Final = (
    Boundary(
        where="supervisor.sinks.hook: run_command ([hook].command)",
        enters="the hook's stdout and stderr (one pipe)", size="4 KiB kept (OUTPUT_KEPT); "
        "the rest read and discarded",
        check="decoded as UTF-8, errors replaced",
        deadline="[hook].timeout_s (30 s) for the run; its output read 1 s past its exit "
                 "(OUTPUT_GRACE_S)",
        released="the hook's process group (SIGKILL) and the pipe",
        reason="timeout (supervisor_hook_runs_total)",
        test="tests/integration/test_reload_hook_process.py::"
             "test_hook_env_hang_fork_flood_and_failure_through_the_daemon"),
)

_STALL = ("tests/integration/test_stalled_database_process.py::"
          "test_a_database_that_never_answers_leaves_no_thread_or_descriptor_behind")
_HANDOFF = ("tests/unit/test_thread_handoffs.py::"
            "test_a_stuck_dependency_exhausts_only_its_own_limit")

DEADLINES: Final = (
    Boundary(
        where="supervisor.controlplane.postgres: every store call (observe, publish, history ...)",
        enters="rows", size="the store's own bounds", check="classify() at the driver boundary",
        deadline="[control_plane].read_timeout_s (17 s): connect, setup and statement",
        released="the socket is shut down, so the worker thread returns; the connection is "
                 "replaced", reason="unavailable", test=_STALL),
    Boundary(
        where="supervisor.controlplane.postgres: connect and a new connection's setup query",
        enters="the session", size="-", check="SQLSTATE class 28 and startup refusals: denied",
        deadline="libpq connect_timeout (a third of read_timeout_s, at most 5 s), then the "
                 "setup within read_timeout_s", released="the socket, the thread",
        reason="denied/unavailable",
        test="tests/integration/test_role_changes_process.py::"
             "test_a_role_not_permitted_to_log_in_is_denied_with_the_control_plane_up"),
    Boundary(
        where="supervisor.controlplane.listen: the LISTEN session's connect and setup "
              "(session settings, pg_is_in_recovery(), LISTEN)",
        enters="the session", size="-", check="a hot standby parks the child (polling alone)",
        deadline="[control_plane].read_timeout_s (17 s), as one store call (call_bounds): "
                 "libpq connect_timeout for the connect, then the setup",
        released="the setup's socket is shut down, so its thread returns; retried with the "
                 "backoff, children.listen reconnecting", reason="-",
        test="tests/integration/test_listen.py::"
             "test_a_server_that_never_answers_the_setup_is_retried_and_reported_reconnecting"),
    Boundary(
        where="supervisor.controlplane.revisions: hydrate",
        enters="the desired revision's body", size="[control_plane].max_revision_bytes",
        check="its size read first (row header)",
        deadline="read_timeout_s plus 1 s per min_read_rate_kib_s KiB of the body",
        released="the socket, the thread; unavailable naming bytes read, control_plane_up true",
        reason="unavailable",
        test="tests/integration/test_slow_hydrate_process.py::"
             "test_a_large_body_over_a_slow_link_is_served_within_its_grown_deadline"),
    Boundary(
        where="supervisor.controlplane.sqlite: every store call",
        enters="rows", size="the store's own bounds", check="classify() at the driver boundary",
        deadline="read_timeout_s (busy waits half of it)",
        released="sqlite3 interrupt(); the connection is replaced", reason="unavailable/conflict",
        test="tests/integration/test_store_sqlite.py::"
             "test_write_lock_held_elsewhere_is_conflict"),
    Boundary(
        where="supervisor.threads.in_thread: every worker-thread hand-off",
        enters="a blocking call's result", size="-",
        check="a limit per dependency (THREAD_LIMITS: database, files, reload, kube, cpu)",
        deadline="the caller's (the token's wait included)",
        released="the caller; the thread keeps only its own dependency's token, counted in "
                 "/status threads_past_deadline", reason="-", test=_HANDOFF),
    Boundary(
        where="supervisor.convergence.side_sinks: cache, snapshot file, forwarded statement",
        enters="file writes and reads", size="the body's", check="-",
        deadline="FILE_IO_DEADLINE_S (60 s)",
        released="the convergence loop (a failed write, retried)", reason="-", test=_HANDOFF),
    Boundary(
        where="supervisor.kube.config: credentials and TLS settings (exec plugins)",
        enters="a kubeconfig's credentials", size="-", check="KubeConfigError",
        deadline="CREDENTIALS_DEADLINE_S (30 s)", released="the fan-out (it retries)",
        reason="-", test=_HANDOFF),
)

#: Every boundary, by area. Each area's rows are kept with the others of that area.
BOUNDARIES: Final = (ADMIN + KUBERNETES + DATABASE + CONFIGURATION + FLEET + COMMANDS + FOLLOWER
                     + HOOK + DEADLINES)
