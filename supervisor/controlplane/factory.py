"""Pick the store for a ``[control_plane].url``: PostgreSQL, SQLite or an upstream replica.

Kept apart from :mod:`supervisor.controlplane.store` (the interface) so the
interface imports no driver and no driver imports the factory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig
    from supervisor.controlplane.store import ControlPlaneStore
    from supervisor.sinks.lkg.accepted import AcceptedStatements

__all__ = ["open_store"]


def open_store(
    config: ControlPlaneConfig,
    *,
    max_schema_version: int,
    statement_timeout_s: float | None = None,
    create: bool = True,
    accepted: AcceptedStatements | None = None,
) -> ControlPlaneStore:
    """The store for ``config.url`` (PostgreSQL, SQLite, an upstream replica); not connected yet.

    ``accepted`` is a follower's highest accepted statement
    (:mod:`supervisor.controlplane.follower`), held by the daemon so that a
    restarted child keeps it; unused by the databases.

    ``create=False`` (the daemon) never creates an SQLite file: a control-plane
    file that vanished is an outage to report, not an empty control plane.
    """
    if config.backend == "follower":
        from supervisor.controlplane.follower import FollowerStore

        return FollowerStore(config, max_schema_version=max_schema_version, accepted=accepted)
    if config.backend == "sqlite":
        from supervisor.controlplane.sqlite import SQLiteStore

        return SQLiteStore(
            config, max_schema_version=max_schema_version,
            statement_timeout_s=statement_timeout_s, create=create,
        )
    from supervisor.controlplane.postgres import PostgresStore

    return PostgresStore(
        config, max_schema_version=max_schema_version, statement_timeout_s=statement_timeout_s
    )
