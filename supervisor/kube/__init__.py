"""A small Kubernetes client for trio: httpx for requests, the official loaders for config.

Modules: :mod:`~supervisor.kube.config` (loaders, lazily importing
``kubernetes``), :mod:`~supervisor.kube.client` (requests, watches),
:mod:`~supervisor.kube.credentials` (token refresh, 401 re-auth),
:mod:`~supervisor.kube.errors` (the exception hierarchy),
:mod:`~supervisor.kube.models` (msgspec Structs of what we read),
:mod:`~supervisor.kube.watching` (list-then-watch), and
:mod:`~supervisor.kube.applying` (server-side apply, write skipping).
This ``__init__`` imports nothing, so importing a submodule stays cheap.
"""
