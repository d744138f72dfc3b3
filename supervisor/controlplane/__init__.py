"""The control plane: where desired state lives, and how a replica hears about changes.

* :mod:`~supervisor.controlplane.store`: the store interface and what it returns.
* :mod:`~supervisor.controlplane.errors`: how stores fail (the hierarchy is drawn there).
* :mod:`~supervisor.controlplane.factory`: :func:`open_admin`, the store for a URL.
* :mod:`~supervisor.controlplane.postgres` / :mod:`~supervisor.controlplane.sqlite`:
  the two databases (imported lazily by :func:`open_admin`), sharing
  :mod:`~supervisor.controlplane.checks` (what both refuse) and
  :mod:`~supervisor.controlplane.runner` (the blocking-connection lifecycle).
* :mod:`~supervisor.controlplane.follower`: another replica as the control plane.
* :mod:`~supervisor.controlplane.revisions`: both databases' statements, and the store
  methods that run them alike.
* :mod:`~supervisor.controlplane.migrations`: the versioned schema.
* :mod:`~supervisor.controlplane.listen`: the LISTEN child (PostgreSQL only),
  which only pokes the convergence loop's change signal.
"""
