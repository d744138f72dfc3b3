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
        check="a regular expression per tag: digits and 32 hex digits only",
        reason="304/200",
        test="tests/integration/test_follower_sibling_roots.py::"
             "test_a_follower_behind_two_sibling_roots_round_robin_stays_converged"),
)

#: Every boundary, by area. Each area's rows are kept with the others of that area.
BOUNDARIES: Final = ADMIN + FOLLOWER
