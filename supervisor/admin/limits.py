"""How many connections the admin API may hold, derived from ``RLIMIT_NOFILE``.

Every accepted connection costs one file descriptor. When connections take the
last descriptors, everything else the daemon does fails with ``EMFILE``: the
control-plane connection, the secret files a compile reads, the snapshot file,
and ``accept`` itself. So the admin server holds at most
:attr:`ConnectionLimits.max_connections`: the soft ``RLIMIT_NOFILE`` minus a
reserve for the daemon's own files and sockets (``max(RESERVE_MIN, limit //
RESERVE_DIVISOR)``).

Stream clients hold their connection for as long as they watch, so they may
take at most :attr:`ConnectionLimits.max_stream_clients`: the configured
``max_clients``, lowered so that a share of ``max_connections``
(``HTTP_HEADROOM_DIVISOR``) always remains for plain requests (``/healthz``,
scrapes, ``status``). :func:`derive` is pure; :func:`current_nofile` reads the
process's limit.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

__all__ = ["ConnectionLimits", "current_nofile", "derive"]

RESERVE_MIN = 64
RESERVE_DIVISOR = 8
HTTP_HEADROOM_MIN = 8
HTTP_HEADROOM_DIVISOR = 8
MIN_CONNECTIONS = 16
# RLIMIT_NOFILE = unlimited does not exist on Linux (nr_open caps it), but the
# arithmetic needs a number: no admin API needs more than this.
UNLIMITED_CONNECTIONS = 65536


@dataclass(frozen=True)
class ConnectionLimits:
    nofile: int | None  # the soft RLIMIT_NOFILE; None = unlimited
    reserve: int  # descriptors kept for the daemon's own files and sockets
    max_connections: int  # admin connections held at once, stream clients included
    max_stream_clients: int  # stream clients at once (never above the configured value)
    configured_stream_clients: int  # what the stream settings asked for

    @property
    def stream_clients_lowered(self) -> bool:
        return self.max_stream_clients < self.configured_stream_clients


def current_nofile() -> int | None:
    """The soft ``RLIMIT_NOFILE`` of this process (None when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def derive(nofile: int | None, stream_clients: int) -> ConnectionLimits:
    """The admin server's limits for a descriptor limit ``nofile``; see the module docstring."""
    if nofile is None:
        reserve = RESERVE_MIN
        max_connections = UNLIMITED_CONNECTIONS
    else:
        reserve = max(RESERVE_MIN, nofile // RESERVE_DIVISOR)
        max_connections = max(MIN_CONNECTIONS, nofile - reserve)
    headroom = max(HTTP_HEADROOM_MIN, max_connections // HTTP_HEADROOM_DIVISOR)
    max_stream = max(1, min(stream_clients, max_connections - headroom))
    return ConnectionLimits(
        nofile=nofile,
        reserve=reserve,
        max_connections=max_connections,
        max_stream_clients=max_stream,
        configured_stream_clients=stream_clients,
    )
