"""The request log of the fake Kubernetes API server, for tests to assert on.

Not a real API server feature (kube-apiserver's nearest is its audit log): every answered
request except ``/_fake/...`` control calls is recorded with its status, whether it was a
watch, whether it changed state (a write that bumped the resourceVersion; a no-op apply
does not) and whether an injected fault answered it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.fakes.apiserver_resources import Obj


@dataclass
class RecordedRequest:
    """One request the server answered (control requests under ``/_fake`` excluded)."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    status: int = 0
    watch: bool = False
    changed: bool = False  # the request changed state (bumped the resourceVersion)
    injected: bool = False  # answered by an ``inject()`` rule
    field_manager: str | None = None
    body: Any = None  # the parsed request body (JSON/YAML), when there was one
    # What the request is about: its path, and for a POST the name it creates appended.
    target: str = ""
    time: float = field(default_factory=time.monotonic)

    def to_json(self) -> Obj:
        data = asdict(self)
        return data


class RequestLog:
    """The introspection methods of :class:`~tests.fakes.apiserver.FakeApiServer`."""

    requests: list[RecordedRequest]

    def count(self, method: str | None = None, path_contains: str | None = None, *,
              watch: bool | None = None, status: int | None = None) -> int:
        return len(self.find_requests(method, path_contains, watch=watch, status=status))

    def find_requests(self, method: str | None = None, path_contains: str | None = None, *,
                      watch: bool | None = None, status: int | None = None,
                      ) -> list[RecordedRequest]:
        return [
            r for r in self.requests
            if (method is None or r.method == method.upper())
            and (path_contains is None or path_contains in (r.target or r.path))
            and (watch is None or r.watch == watch)
            and (status is None or r.status == status)
        ]

    def writes(self, path_contains: str | None = None) -> list[RecordedRequest]:
        """Non-GET requests that changed state (a no-op apply is not one)."""
        return [r for r in self.requests if r.method != "GET" and r.changed
                and (path_contains is None or path_contains in (r.target or r.path))]

    def clear_requests(self) -> None:
        self.requests.clear()


__all__ = ["RecordedRequest", "RequestLog"]
