"""The followers a replica has seen: what ``GET /v1/followers`` answers.

:class:`Followers` holds them; :func:`describe_follower` is the other side:
what this replica, a follower, says of itself.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import msgspec

from supervisor.bounds import OutOfRange, TooLarge
from supervisor.controlplane.replica_name import ReplicaName, follower_state, parse
from supervisor.logs import get_logger

if TYPE_CHECKING:
    from supervisor.config import AdminConfig, Config
    from supervisor.convergence.status import RevisionStatus

__all__ = ["FORGET_AFTER_POLLS", "MAX_FOLLOWERS", "FollowerRow", "Followers", "FollowersAnswer",
           "describe_follower", "own_url"]

log = get_logger("admin")

MAX_FOLLOWERS: Final = 256
FORGET_AFTER_POLLS: Final = 3


class FollowerRow(msgspec.Struct, frozen=True):
    """One follower as last seen (``last_seen``: ISO-8601 UTC)."""

    url: str
    sequence: int | None
    etag: str | None
    state: str
    reason: str | None
    last_seen: str


class FollowersAnswer(msgspec.Struct):
    """``GET /v1/followers``."""

    followers: list[FollowerRow]


class Followers:
    """The table of direct followers, one row per URL.

    Each ``/v1/revision`` fetch or stream handshake that names its follower updates its row
    (:mod:`supervisor.controlplane.replica_name`). A row is forgotten
    :data:`FORGET_AFTER_POLLS` of the follower's poll intervals after it was last seen.
    At most :data:`MAX_FOLLOWERS` are held: a new URL past that replaces the oldest-seen row.
    So a follower naming itself under ever new URLs costs a bounded table.
    An honest follower pushed out is listed again at its next poll.
    """

    def __init__(self, *, limit: int = MAX_FOLLOWERS,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._limit = limit
        self._clock = clock
        self._wall_clock = wall_clock
        # Each follower's row, and until when it is kept.
        self._rows: dict[str, tuple[float, FollowerRow]] = {}

    def note(self, headers: Sequence[tuple[bytes, bytes]]) -> None:
        """Note the follower a request's headers name, if any (a malformed name: ignored)."""
        try:
            name = parse(headers)
        except (TooLarge, OutOfRange) as exc:
            log.debug("a follower's name ignored", why=str(exc)[:300])
            return
        if name is not None:
            self.seen(name)

    def seen(self, name: ReplicaName) -> None:
        now = self._clock()
        self._forget(now)
        self._rows.pop(name.url, None)
        if len(self._rows) >= self._limit:
            del self._rows[next(iter(self._rows))]  # insertion order: seen longest ago
        wall = self._wall_clock().astimezone(UTC).isoformat(timespec="milliseconds")
        row = FollowerRow(name.url, name.sequence, name.etag, name.state, name.reason,
                          wall.replace("+00:00", "Z"))
        self._rows[name.url] = (now + FORGET_AFTER_POLLS * name.poll_interval_s, row)

    def _forget(self, now: float) -> None:
        for url in [url for url, (until, _) in self._rows.items() if now > until]:
            del self._rows[url]

    def answer(self) -> FollowersAnswer:
        self._forget(self._clock())
        return FollowersAnswer(sorted((row for _, row in self._rows.values()),
                                      key=lambda row: row.url))

    def count(self, state: str) -> int:
        """Followers listed in ``state`` (``supervisor_followers{state}``)."""
        self._forget(self._clock())
        return sum(1 for _, row in self._rows.values() if row.state == state)



def own_url(config: AdminConfig) -> str:
    """The address this replica names itself by: ``[admin].advertise_url``, else its listen
    address (https with TLS; a wildcard address as this host's name)."""
    if config.advertise_url is not None:
        return config.advertise_url
    host, port = config.host_port
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    scheme = "https" if config.tls_cert_file is not None else "http"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def describe_follower(config: Config, status: RevisionStatus) -> ReplicaName:
    """How this follower names itself now (:func:`~.replica_name.follower_state`)."""
    from supervisor.admin.signed import etag_for

    state, snapshot, rejection = status.state, status.state.snapshot, status.last_rejection
    statement = state.statement
    named, reason = follower_state(
        stale=statement is not None and statement.expired(datetime.now(UTC)),
        failing=bool(status.consecutive_failures) and status.control_plane_up,
        reason=None if rejection is None else rejection.reason,
        serves_desired=status.desired is not None and status.active == status.desired)
    return ReplicaName(
        url=own_url(config.admin), sequence=state.sequence,
        etag=None if snapshot is None else etag_for(snapshot.revision, state.body_sha256,
                                                    statement),
        state=named, reason=reason, poll_interval_s=config.control_plane.poll_interval_s)
