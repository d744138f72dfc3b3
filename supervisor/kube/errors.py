"""Errors of the Kubernetes client, mapped from httpx, msgspec and the loaders.

:func:`supervisor.fanout.preflight.classify_watch_error` is the one place that
turns them into the ``schema_skew`` / ``namespace_or_rbac_unready`` labels.
"""

from __future__ import annotations

from typing import Any

from supervisor.errors import SupervisorError, describe_failure

__all__ = [
    "ApiError",
    "Conflict",
    "DecodeError",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeConfigError",
    "KubeError",
    "NotFound",
    "SchemaSkew",
    "StreamStalled",
    "TimedOut",
    "TooLargeResponse",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "api_error",
    "transport_error",
]


class KubeError(SupervisorError):
    """Base of every Kubernetes client failure.

    The client raises each failure as one of these, ``from`` the foreign error. So
    callers (preflight, watchers, reconcilers) never see httpx or msgspec types.

    ``retry_after``: the seconds a 429's ``Retry-After`` asked for; None otherwise.
    A retry loop floors its backoff with it, whatever the failure.
    """

    retry_after: float | None = None


class KubeConfigError(KubeError):
    """The kubeconfig or the in-cluster service-account configuration cannot be loaded."""


class ApiError(KubeError):
    """The API server answered with HTTP ``status``.

    ``reason`` and ``message`` come from the ``Status`` body when there is one
    (``reason`` is Kubernetes' CamelCase word, e.g. ``Forbidden``); ``body`` is
    the raw body, truncated, for diagnostics; ``retry_after`` is kept on a 429 only.
    """

    def __init__(
        self,
        status: int,
        reason: str = "",
        message: str = "",
        *,
        body: bytes = b"",
        method: str = "",
        path: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body[:2048]
        self.method = method
        self.path = path
        if isinstance(self, TooManyRequests):
            self.retry_after = retry_after  # only a 429's Retry-After is a floor (KubeError)
        where = f"{method} {path}: " if method else ""
        detail = f" {reason}" if reason else ""
        text = f": {message}" if message else ""
        super().__init__(f"{where}HTTP {status}{detail}{text}")


class Unauthorized(ApiError):
    """401: the credentials were refused even after re-reading the token."""


class Forbidden(ApiError):
    """403: RBAC does not allow this verb on this resource in this namespace."""


class NotFound(ApiError):
    """404: the object, its namespace, or the resource type (CRD) does not exist."""


class Conflict(ApiError):
    """409: a concurrent writer, or a field-manager conflict; a reconciler requeues, never drops."""


class Gone(ApiError):
    """410: the resourceVersion is older than the server keeps; relist."""


class Invalid(ApiError):
    """422: the object was refused by validation; retrying the same body cannot help."""


class TooManyRequests(ApiError):
    """429: the server asks us to slow down; ``retry_after`` seconds when it said."""


_BY_STATUS: dict[int, type[ApiError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def api_error(status: int, *args: Any, **kwargs: Any) -> ApiError:
    """The most specific :class:`ApiError` subclass for ``status``; the rest as ApiError's."""
    return _BY_STATUS.get(status, ApiError)(status, *args, **kwargs)


class TransportError(KubeError):
    """No usable HTTP answer: connection refused or reset, timeout, TLS failure."""


def transport_error(where: str, exc: BaseException, certificate_hint: str | None = None, *,
                    timed_out: bool = False) -> TransportError:
    """``where`` failed with the foreign ``exc``, told down to its TLS or OS error.

    Told as :func:`supervisor.errors.describe_failure` tells it; ``certificate_hint`` names
    where the CA comes from. httpx's ``ConnectError`` often has no text: the refused
    connection or certificate is in its chain. A :class:`TimedOut` when ``timed_out`` (the
    caller knows its library's timeout type). Raise it ``from exc``.
    """
    cls = TimedOut if timed_out else TransportError
    return cls(f"{where}: {describe_failure(exc, certificate_hint=certificate_hint)}")


class TimedOut(TransportError):
    """A deadline passed: the response headers, one read, or the whole body came too late."""


class TooLargeResponse(KubeError):
    """A response body or one watch line is over its bound: refused before it is held whole."""


class StreamStalled(TimedOut):
    """A watch stream sent nothing (not even a bookmark) within the inactivity deadline."""


class DecodeError(KubeError):
    """A response body is not the JSON we expect (malformed, or of another type)."""


class SchemaSkew(DecodeError):
    """The body is JSON but does not decode into the expected type.

    For a custom resource this means the installed CRD's schema is older or
    newer than what this build reads. ``path`` is msgspec's ``$.items[0]...``
    location when known.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        self.path = path
        super().__init__(message)
