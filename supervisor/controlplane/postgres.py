"""The PostgreSQL control-plane store, driven from trio through worker threads.

psycopg's async API is asyncio-only, so
each call runs the synchronous ``psycopg.Connection`` in a worker thread that
trio may abandon (``abandon_on_cancel=True``), one call at a time per
connection (a ``CapacityLimiter(1)``). A cancelled call asks the server to
stop its statement (``cancel_safe``, shielded and time-limited) and the
connection is replaced: the old one is closed by its worker thread once the
driver returns, because closing it under a running call is unsafe.

Bounds on every call, so nothing can hang the convergence loop:
``connect_timeout``; a server-side ``statement_timeout`` (set per transaction
with ``SET LOCAL``, never per session: see :func:`bounded`); TCP keepalives and
``tcp_user_timeout`` against half-open connections; and a client-side deadline
covering connect plus statement, which also catches what the server cannot
(a network that swallows packets). Values already present in the DSN win over
these defaults.

Connections are made lazily, by the first call, and remade by the next call
after one breaks. Each call is one short explicit transaction and nothing is
left open between calls (an idle-in-transaction session holds back vacuum and
the NOTIFY queue).

Fleets (README "fleets"): the store relies on no session state at all (no
session ``SET``, no server-side prepared statements, transaction-scoped
advisory locks in migrations), so it works unchanged behind PgBouncer in
transaction pooling mode and against a hot standby (reads only; ``publish``
and ``migrate`` are refused there as ``unavailable``, a read-only transaction).

Failures are mapped here, at the driver boundary, by :func:`classify`
(categories in :mod:`supervisor.controlplane.errors`), chained with ``from``,
with the DSN's password scrubbed from every message.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from supervisor.controlplane import migrations, revisions
from supervisor.controlplane.postgres_driver import (
    CONNECT_TIMEOUT_S,
    PostgresConnections,
    dsn_sets_statement_timeout,
    timeout_ms,
)
from supervisor.controlplane.runner import ConnectionRunner
from supervisor.dsn import redact
from supervisor.logs import get_logger

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig

__all__ = ["PostgresStore"]

log = get_logger("controlplane")

# Schema changes can queue behind the advisory lock of another replica's run.
MIGRATE_TIMEOUT_S = 120.0


class PostgresStore(revisions.DatabaseStore):
    """ControlPlaneStore on PostgreSQL (see the module docstring)."""

    _sql = revisions.pg

    def __init__(
        self,
        config: ControlPlaneConfig,
        *,
        max_schema_version: int,
        statement_timeout_s: float = 10.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self._url = config.url
        self._channel = config.channel
        self._max_bytes = config.max_revision_bytes
        self._max_schema = max_schema_version
        # The client-side deadline: a connect plus one statement, plus slack
        # so the server's own statement_timeout normally fires first (its
        # error says more than ours).
        # Per call, never per session (see bounded()); the DSN's options win.
        self._connections = PostgresConnections(
            config.url, connect_timeout_s,
            None if dsn_sets_statement_timeout(config.url) else timeout_ms(statement_timeout_s),
        )
        self._runner = ConnectionRunner(
            self._connections, deadline_s=connect_timeout_s + statement_timeout_s + 2.0)

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self._url)!r})"

    @property
    def identity(self) -> str | None:
        """The cluster and database (``postgresql:<system id>/<oid>``) of the last connect."""
        return self._connections.identity

    async def migrate(self) -> migrations.Migrated:
        done = await self._runner.run("migrate", partial(
            migrations.migrate_postgres, channel=self._channel), deadline_s=MIGRATE_TIMEOUT_S)
        log.info("control-plane schema migrated" if done.before < done.after
                 else "control-plane schema up to date",
                 before=done.before, version=done.after, url=redact(self._url))
        return done
