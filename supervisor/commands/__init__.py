"""The subcommands beyond running the daemon, one module per concern.

:mod:`supervisor.cli` builds the parser and registers these; each module adds
its own arguments (``register``) and holds its ``cmd_*`` functions, which
return the exit code (:mod:`.common`).
"""
