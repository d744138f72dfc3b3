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
        where="supervisor.bounds.in_thread: every worker-thread hand-off",
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
BOUNDARIES: Final = ADMIN + DEADLINES
