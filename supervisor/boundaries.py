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

FLEET: Final = (
    Boundary(
        where="supervisor.controlplane.replica_name.parse: GET /v1/revision and the stream "
              "handshake (supervisor.admin.fleet.Followers.note)",
        enters="a follower's X-Supervisor-Follower-* headers",
        size="url 512, etag 128, reason 32 bytes; at most 256 followers held (MAX_FOLLOWERS)",
        check="http(s) URL of printable ASCII; sequence 0..2^62; state converged/refusing/"
              "stale; poll interval 0.01 s and up, capped at 3600 s; a malformed name ignored",
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
)

#: Every boundary, by area. Each area's rows are kept with the others of that area.
BOUNDARIES: Final = ADMIN + FLEET
