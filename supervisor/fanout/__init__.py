"""Fan-out: ServiceDefinition and Workflow custom resources -> children in the apps namespace.

Import :mod:`.children` only when ``[kubernetes].enabled``; otherwise the daemon imports
only :mod:`.status`. This ``__init__`` imports nothing.
"""
