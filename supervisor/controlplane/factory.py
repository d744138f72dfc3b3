"""Open the store a ``[control_plane].url`` names, for the loop or for the commands.

Kept apart from :mod:`.store`: the protocols import no driver, and no driver imports this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from supervisor.controlplane.errors import ControlPlaneError, FailureCategory

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig
    from supervisor.controlplane.store import RevisionAdmin, RevisionSource
    from supervisor.sinks.lkg.accepted import AcceptedStatements

__all__ = ["open_admin", "open_source"]


def open_source(config: ControlPlaneConfig, *, max_schema_version: int,
                accepted: AcceptedStatements | None = None) -> RevisionSource:
    """What the convergence loop reads: a database, or an upstream replica; not connected yet.

    ``accepted`` is a follower's highest accepted statement, held by the
    daemon so a restarted child keeps it; unused by the databases. An SQLite
    file is never created here: a control-plane file that vanished is an
    outage to report, not an empty control plane.
    """
    if config.backend == "follower":
        from supervisor.controlplane.follower import FollowerStore

        return FollowerStore(config, max_schema_version=max_schema_version, accepted=accepted)
    return _database(config, max_schema_version=max_schema_version, create=False)


def open_admin(config: ControlPlaneConfig, *, max_schema_version: int,
               statement_timeout_s: float | None = None, create: bool = True) -> RevisionAdmin:
    """The revision lifecycle on a database; not connected yet.

    A follower has no control plane of its own: refused (``invalid``), naming
    its upstream. ``create=False`` never creates an SQLite file.
    """
    if config.backend == "follower":
        raise ControlPlaneError(
            f"this replica follows {config.url} and has no control plane of its own: publish, "
            "history, show, rollback and db run against the upstream's control plane; nothing "
            "was changed",
            category=FailureCategory.INVALID)
    return _database(config, max_schema_version=max_schema_version,
                     statement_timeout_s=statement_timeout_s, create=create)


def _database(config: ControlPlaneConfig, *, max_schema_version: int,
              statement_timeout_s: float | None = None, create: bool) -> RevisionAdmin:
    if config.backend == "sqlite":
        from supervisor.controlplane.sqlite import SQLiteStore

        return SQLiteStore(config, max_schema_version=max_schema_version,
                           statement_timeout_s=statement_timeout_s, create=create)
    from supervisor.controlplane.postgres import PostgresStore

    return PostgresStore(config, max_schema_version=max_schema_version,
                         statement_timeout_s=statement_timeout_s)
