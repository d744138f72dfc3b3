"""Errors of the admin API, its server and its client side, under :class:`AdminError`.

Messages never contain the bearer token.
"""

from __future__ import annotations

from supervisor.errors import StartError, SupervisorError

__all__ = ["AdminBindError", "AdminError", "AdminRefused", "AdminUnreachable"]


class AdminError(SupervisorError):
    """Base class of the admin API's own errors."""


class AdminBindError(StartError, AdminError):
    """``[admin].listen`` cannot be bound (in use, not local, not permitted, unresolvable).

    ``path`` names the key, ``reason`` says why with the address in it.
    A StartError: the tree does not restart it and the CLI exits 1, so systemd retries.
    """

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.path = "$.admin.listen"
        self.reason = f"address {address} {reason}"
        super().__init__(f"{self.path}: {self.reason}")


class AdminUnreachable(AdminError):
    """The admin API could not be reached or did not answer as expected.

    A connect failure, a timeout, a non-200 answer, an undecodable body, a stream
    that ended abnormally, or an address that is not a URL.
    ``status_code`` is the HTTP status when the server answered (None otherwise).
    """

    def __init__(self, url: str, reason: str, *, status_code: int | None = None) -> None:
        self.url = url
        self.reason = reason
        self.status_code = status_code
        super().__init__(f"{url}: {reason}")


class AdminRefused(AdminUnreachable):
    """The server answered 401 or 403: the token is missing or wrong.

    Retrying cannot help, so ``watch`` does not reconnect.
    """
