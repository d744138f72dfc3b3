"""The subcommands beyond running the daemon, one module per concern.

Each module adds its arguments (``register``) and holds its ``cmd_*`` functions,
which return the exit code. :mod:`supervisor.cli` builds the parser.
"""
