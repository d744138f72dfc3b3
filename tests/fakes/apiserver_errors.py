"""Errors of the fake Kubernetes API server, answered as ``Status`` objects.

Follows kube-apiserver's failure bodies (``kind: Status``, ``status: Failure``, ``reason``,
``code``, ``details``; the reasons of ``k8s.io/apimachinery/pkg/api/errors``), including the
504 ``Timeout`` with cause ``ResourceVersionTooLarge`` that the watch cache answers for a
resourceVersion newer than its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.fakes.apiserver_resources import Obj


class ApiError(Exception):
    """An error answered as a Kubernetes ``Status`` object."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details) if details else None
        self.headers = dict(headers) if headers else {}

    def status(self) -> Obj:
        return status_body(self.code, self.reason, self.message, self.details)


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def reason_for(code: int) -> str:
    return _REASONS.get(code, "Unknown")


def status_body(
    code: int, reason: str | None = None, message: str | None = None, details: Any = None
) -> Obj:
    """A ``Status`` object as the real API server sends it for a failure."""
    reason = reason or reason_for(code)
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message if message is not None else reason,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def not_found_resource() -> ApiError:
    return ApiError(
        404, "NotFound", "the server could not find the requested resource", details={}
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def too_large_resource_version(requested: int, current: int) -> ApiError:
    """What kube-apiserver answers for an RV newer than its own, once it has waited for it
    (``storage.NewTooLargeResourceVersionError``: a 504 ``Timeout`` whose cause type is
    ``ResourceVersionTooLarge``, retry after 1 s)."""
    return ApiError(
        504, "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        details={"causes": [{"reason": "ResourceVersionTooLarge",
                             "message": "Too large resource version"}],
                 "retryAfterSeconds": 1})


__all__ = [
    "ApiError",
    "bad_request",
    "not_found_resource",
    "reason_for",
    "status_body",
    "too_large_resource_version",
]
