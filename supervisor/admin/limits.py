"""How many connections the admin API may hold, derived from ``RLIMIT_NOFILE``.

:func:`raise_nofile` lifts the soft limit, :func:`current_nofile` reads it,
:func:`derive` turns it into :class:`ConnectionLimits`.
Operators: docs/operations.md, "The stream at scale".
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
    """How many connections, and stream clients among them, the admin server holds.

    Each connection costs a descriptor; the last ones taken make everything else fail
    with ``EMFILE``. That is the control-plane connection, a compile's secret files,
    the snapshot file and ``accept`` itself. Hence ``reserve``, kept back from ``nofile``.
    Stream clients hold their connection while they watch: a share of
    ``max_connections`` is kept from them for ``/healthz``, scrapes and ``status``.
    """

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
    """Raise the soft ``RLIMIT_NOFILE`` to ``min(hard, target)``, before limits are derived.

    Returns ``(before, after)`` when it moved, None when it was there or cannot move.
    The soft limit (systemd: 1024, hard 524288) only protects ``select()`` users.
    This daemon uses none (trio uses epoll, psycopg ``poll()``). So the operator's
    hard limit (``LimitNOFILE=``, ``ulimit -Hn``) is the one that counts.
    """
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
    """The admin server's limits for descriptor limit ``nofile``; pure.

    Connections: ``nofile`` minus ``max(RESERVE_MIN, nofile // RESERVE_DIVISOR)``.
    Stream clients: connections minus ``HTTP_HEADROOM_DIVISOR``'s share, about 77% of ``nofile``.
    So 16384 gives 12,544 stream clients. A configured ``stream_clients`` (tests,
    benchmarks; None: derived only) can only lower it.
    """
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
