"""The table of every boundary where data enters the process, or the process waits on one.

One :class:`Boundary` a row: what enters, its size bound, its range or shape
check, its deadline and what the deadline releases, its reason label, and the
test that proves it. ``docs/boundaries.md`` is rendered from :data:`BOUNDARIES`
(``python -m tools.docsgen``); a unit test checks every row's test exists. The
bounds themselves are the constants of the modules named here, used through
:mod:`supervisor.bounds`.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["BOUNDARIES", "DATABASE", "Boundary"]


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
        where="supervisor.controlplane.checks: hydrate_sql, revision, history",
        enters="supervisor_revisions.message (SQLite: created_at too)",
        size="4 KiB (MESSAGE_BYTES: left/substr in SQL, and its length)",
        check="cut and marked with the full length (bounds.cut_read), never refused",
        reason="-",
        test="tests/integration/test_memory_process.py::"
             "test_a_huge_message_is_read_cut_and_costs_the_daemon_no_memory"),
    Boundary(
        where="supervisor.controlplane.revisions: revision and history",
        enters="supervisor_revisions.message", size="4 KiB (MESSAGE_BYTES)",
        check="cut and marked, the same as hydrate", reason="-",
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
)

#: Every boundary, by area. Each area's rows are kept with the others of that area.
BOUNDARIES: Final = ADMIN + DATABASE
