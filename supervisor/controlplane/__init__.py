"""The control plane: where desired state lives, and how a replica hears about changes.

* :mod:`~supervisor.controlplane.store`: the store interface, its failure
  categories and error hierarchy, :func:`open_store`.
* :mod:`~supervisor.controlplane.postgres` / :mod:`~supervisor.controlplane.sqlite`:
  the two implementations (imported lazily by :func:`open_store`).
* :mod:`~supervisor.controlplane.migrations`: the versioned schema.
* :mod:`~supervisor.controlplane.listen`: the LISTEN child (PostgreSQL only),
  which only pokes the convergence loop's ChangeSignal.
* :mod:`~supervisor.dsn`: keeping the DSN's password out of logs.
"""

from supervisor.controlplane.store import (
    ControlPlaneError,
    ControlPlaneStore,
    FailureCategory,
    Incompatible,
    LoadedRevision,
    TooLarge,
    open_store,
)

__all__ = [
    "ControlPlaneError",
    "ControlPlaneStore",
    "FailureCategory",
    "Incompatible",
    "LoadedRevision",
    "TooLarge",
    "open_store",
]
