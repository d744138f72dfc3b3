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

#: Every boundary, by area. Each area's rows are kept with the others of that area.
BOUNDARIES: Final = ADMIN + COMMANDS
