"""How many connections the admin API may hold, derived from ``RLIMIT_NOFILE``.

Every accepted connection costs one file descriptor. When connections take the
last descriptors, everything else the daemon does fails with ``EMFILE``: the
control-plane connection, the secret files a compile reads, the snapshot file,
and ``accept`` itself. So the admin server holds at most
:attr:`ConnectionLimits.max_connections`: the soft ``RLIMIT_NOFILE`` minus a
reserve for the daemon's own files and sockets (``max(RESERVE_MIN, limit //
RESERVE_DIVISOR)``).

Stream clients hold their connection for as long as they watch, so they may
take at most :attr:`ConnectionLimits.max_stream_clients`: what is left once a
share of ``max_connections`` (``HTTP_HEADROOM_DIVISOR``) is kept for plain
requests (``/healthz``, scrapes, ``status``), i.e. about 77% of the soft limit;
a configured ``max_clients`` (tests, benchmarks) can only lower it.

The soft limit is usually far below the hard one (systemd: 1024 soft, 524288
hard; the soft 1024 only protects programs that use ``select()``, which this
daemon does not: trio uses epoll and psycopg ``poll()``). :func:`raise_nofile`
raises the soft limit to the hard limit, at most ``NOFILE_TARGET``, before the
limits are derived, so the descriptor limit an operator sets (``LimitNOFILE=``,
``ulimit -Hn``) is the one that counts: 16384 gives 12,544 stream clients.
:func:`derive` is pure; :func:`current_nofile` reads the process's limit.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["NOFILE_TARGET", "ConnectionLimits", "current_nofile", "derive", "raise_nofile"]

RESERVE_MIN = 64
RESERVE_DIVISOR = 8
HTTP_HEADROOM_MIN = 8
HTTP_HEADROOM_DIVISOR = 8
MIN_CONNECTIONS = 16
# RLIMIT_NOFILE = unlimited does not exist on Linux (nr_open caps it), but the
# arithmetic needs a number: no admin API needs more than this.
UNLIMITED_CONNECTIONS = 65536
# The soft limit is raised toward the hard limit up to this: about 50,000
# stream clients, more than the memory of a control VM holds (docs/operations.md, "The
# stream at scale": tens of KiB per subscriber).
NOFILE_TARGET = 65536


@dataclass(frozen=True)
class ConnectionLimits:
    nofile: int | None  # the soft RLIMIT_NOFILE; None = unlimited
    reserve: int  # descriptors kept for the daemon's own files and sockets
    max_connections: int  # admin connections held at once, stream clients included
    max_stream_clients: int  # stream clients at once (never above a configured value)
    configured_stream_clients: int | None  # what the stream settings asked for (None: derive)

    @property
    def stream_clients_lowered(self) -> bool:
        configured = self.configured_stream_clients
        return configured is not None and self.max_stream_clients < configured


def current_nofile() -> int | None:
    """The soft ``RLIMIT_NOFILE`` of this process (None when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def raise_nofile(
    target: int = NOFILE_TARGET,
    *,
    getrlimit: Callable[[int], tuple[int, int]] = resource.getrlimit,
    setrlimit: Callable[[int, tuple[int, int]], None] = resource.setrlimit,
) -> tuple[int, int] | None:
    """Raise the soft ``RLIMIT_NOFILE`` to ``min(hard, target)``; returns ``(before,
    after)`` when it moved, None when it was already there (or cannot move)."""
    soft, hard = getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    want = target if hard == infinity else min(hard, target)
    if soft == infinity or soft >= want:
        return None
    try:
        setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError):
        return None  # a sandbox that forbids it: the current soft limit stays the bound
    return (int(soft), int(want))


def derive(nofile: int | None, stream_clients: int | None) -> ConnectionLimits:
    """The admin server's limits for a descriptor limit ``nofile`` and a configured
    stream client limit (None: derived only); see the module docstring."""
    if nofile is None:
        reserve = RESERVE_MIN
        max_connections = UNLIMITED_CONNECTIONS
    else:
        reserve = max(RESERVE_MIN, nofile // RESERVE_DIVISOR)
        max_connections = max(MIN_CONNECTIONS, nofile - reserve)
    headroom = max(HTTP_HEADROOM_MIN, max_connections // HTTP_HEADROOM_DIVISOR)
    derived = max(1, max_connections - headroom)
    max_stream = derived if stream_clients is None else max(1, min(stream_clients, derived))
    return ConnectionLimits(
        nofile=nofile,
        reserve=reserve,
        max_connections=max_connections,
        max_stream_clients=max_stream,
        configured_stream_clients=stream_clients,
    )
