"""Fan-out: ServiceDefinition and Workflow custom resources -> children in the apps namespace.

Import :mod:`supervisor.fanout.children` (``fanout_children``) only when
``[kubernetes].enabled``; :mod:`supervisor.fanout.status` is the only module
the daemon imports otherwise. This package ``__init__`` imports nothing.
"""
