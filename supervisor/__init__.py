"""trio-supervisor: a control-VM daemon on trio.

The public surface of the package is the command line (``supervisor.cli``) and
the outside contract it serves; the modules below are internal and laid out so
that each data path reads from the folder names alone (see docs/architecture.md).
"""

__version__ = "0.1.0"
