"""The admin API: HTTP routes and the live stream (server side), ``status`` and
``watch`` (client side). See :mod:`.app` and :mod:`.routes` for the routes,
:mod:`.stream` for the stream's messages, :mod:`.server` for binding and
shutdown, :mod:`.client` for the CLI's functions."""

from supervisor.admin.context import AdminContext
from supervisor.admin.errors import AdminBindError, AdminError, AdminRefused, AdminUnreachable

__all__ = ["AdminBindError", "AdminContext", "AdminError", "AdminRefused", "AdminUnreachable"]
