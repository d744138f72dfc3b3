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

import hashlib
from functools import partial
from typing import TYPE_CHECKING

from supervisor.controlplane import migrations, revisions
from supervisor.controlplane.checks import (
    OBSERVE_SQL,
    HydrateRow,
    check_hydrated,
    check_publishable,
    pointer_from_row,
)
from supervisor.controlplane.postgres_driver import (
    CONNECT_TIMEOUT_S,
    Conn,
    PostgresConnections,
    dsn_sets_statement_timeout,
    timeout_ms,
)
from supervisor.controlplane.runner import ConnectionRunner
from supervisor.controlplane.store import LoadedRevision, RevisionPointer
from supervisor.dsn import redact
from supervisor.logs import get_logger

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig
    from supervisor.controlplane.revisions import DesiredChange, RevisionSummary

__all__ = ["PostgresStore"]

log = get_logger("controlplane")

# Schema changes can queue behind the advisory lock of another replica's run.
MIGRATE_TIMEOUT_S = 120.0


class PostgresStore:
    """ControlPlaneStore on PostgreSQL (see the module docstring)."""

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
        self._run = self._runner.run

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self._url)!r})"

    # -- the protocol -------------------------------------------------------------

    async def desired(self) -> int | None:
        def read(conn: Conn) -> int | None:
            row = conn.execute(
                "SELECT revision_id FROM supervisor_desired WHERE singleton"
            ).fetchone()
            return None if row is None else int(row[0])

        return await self._run("read", read)

    async def observe(self) -> RevisionPointer | None:
        def read(conn: Conn) -> RevisionPointer | None:
            with conn.cursor(binary=True) as cur:
                row = cur.execute(OBSERVE_SQL).fetchone()
            return pointer_from_row(row, self._connections.identity)

        return await self._run("read", read)

    async def hydrate(self) -> LoadedRevision | None:
        max_bytes, max_schema = self._max_bytes, self._max_schema

        def read(conn: Conn) -> LoadedRevision | None:
            # One statement is one snapshot, even under READ COMMITTED: the
            # pointer and the revision it names are read consistently. The
            # body is withheld in SQL when it is too large or too new, so an
            # oversize body never crosses the network. Binary format: bytea
            # travels as raw bytes rather than hex text twice the size.
            with conn.cursor(binary=True) as cur:
                row = cur.execute(
                    "SELECT d.revision_id, r.id, r.schema_version, octet_length(r.body),"
                    " CASE WHEN octet_length(r.body) <= %(max_bytes)s"
                    "       AND r.schema_version <= %(max_schema)s THEN r.body END,"
                    " r.body_sha256, r.created_at, r.message, d.sequence"
                    " FROM supervisor_desired d"
                    " LEFT JOIN supervisor_revisions r ON r.id = d.revision_id"
                    " WHERE d.singleton",
                    {"max_bytes": max_bytes, "max_schema": max_schema},
                ).fetchone()
            if row is None:
                return None
            return check_hydrated(
                HydrateRow(*row), max_revision_bytes=max_bytes, max_schema_version=max_schema
            )

        return await self._run("hydrate", read)

    async def publish(self, body: bytes, schema_version: int, message: str | None) -> int:
        check_publishable(
            body, schema_version,
            max_revision_bytes=self._max_bytes, max_schema_version=self._max_schema,
        )

        def write(conn: Conn) -> int:
            digest = hashlib.sha256(body).digest()
            with conn.transaction():
                revisions.pg.say_why(conn, message)
                row = conn.execute(
                    "INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)"
                    " VALUES (%s, %b, %b, %s) RETURNING id",
                    [schema_version, body, digest, message],
                ).fetchone()
                assert row is not None  # INSERT ... RETURNING always returns the row
                revision = int(row[0])
                # The trigger on supervisor_desired sends the NOTIFY, at commit.
                conn.execute(
                    "INSERT INTO supervisor_desired (singleton, revision_id) VALUES (true, %s)"
                    " ON CONFLICT (singleton) DO UPDATE"
                    " SET revision_id = EXCLUDED.revision_id, updated_at = now()",
                    [revision],
                )
            return revision

        revision = await self._run("publish", write)
        log.info("revision published", revision=revision, bytes=len(body))
        return revision

    async def migrate(self) -> migrations.Migrated:
        channel = self._channel

        def run(conn: Conn) -> migrations.Migrated:
            return migrations.migrate_postgres(conn, channel=channel)

        done = await self._run("migrate", run, deadline_s=MIGRATE_TIMEOUT_S)
        log.info("control-plane schema migrated" if done.before < done.after
                 else "control-plane schema up to date",
                 before=done.before, version=done.after, url=redact(self._url))
        return done

    # -- the revision lifecycle (statements in controlplane.revisions) --

    async def history(self, limit: int | None) -> tuple[int | None, list[RevisionSummary]]:
        return await self._run("history", partial(revisions.pg.history, limit=limit))

    async def revision(self, revision: int) -> LoadedRevision:
        return await self._run("read", partial(revisions.pg.read_revision, revision=revision,
                                               max_bytes=self._max_bytes))

    async def rollback(self, revision: int, body_sha256: bytes,
                       message: str | None = None) -> int | None:
        previous: int | None = await self._run("rollback", partial(
            revisions.pg.rollback, revision=revision, body_sha256=body_sha256, message=message))
        log.info("desired revision rolled back", revision=revision, previous=previous)
        return previous

    async def prune(self, keep: int) -> list[int]:
        return await self._run("prune", partial(revisions.pg.prune, keep=keep))

    async def changes(self, limit: int | None) -> list[DesiredChange]:
        return await self._run("history", partial(revisions.pg.changes, limit=limit))

    async def aclose(self) -> None:
        await self._runner.aclose()
