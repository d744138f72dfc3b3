"""ASGI plumbing of the fake Kubernetes API server: bodies in, JSON answers out.

Follows kube-apiserver's wire format where it matters to clients: JSON bodies
(``application/json``) with a ``content-length``; request bodies that are not JSON are a
400 ``BadRequest``; an apply body may be YAML, whose timestamps stay strings as when
Kubernetes converts YAML to JSON.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from tests.fakes.apiserver_errors import ApiError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def json_bytes(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"error decoding request body: {exc}") from exc


def parse_yaml(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - PyYAML comes with kubernetes
        raise ApiError(400, "BadRequest", "apply body is not JSON and PyYAML is missing") from exc

    class _Loader(yaml.SafeLoader):  # type: ignore[misc]
        """Timestamps stay strings, as when Kubernetes converts YAML to JSON."""

    _Loader.yaml_implicit_resolvers = {
        key: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    try:
        return yaml.load(raw, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ApiError(400, "BadRequest", f"error decoding YAML: {exc}") from exc


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            break
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            break
    return b"".join(chunks)


async def wait_disconnect(receive: Receive, scope: trio.CancelScope,
                          gone: trio.Event | None = None) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            if gone is not None:
                gone.set()
            scope.cancel()
            return


async def respond_raw(send: Send, status: int, body: bytes, content_type: str,
                      headers: Mapping[str, str] | None = None) -> None:
    hdrs = [(b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode())]
    hdrs += [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def respond_json(send: Send, status: int, data: Any,
                       headers: Mapping[str, str] | None = None) -> None:
    await respond_raw(send, status, json_bytes(data), "application/json", headers)


__all__ = [
    "Receive",
    "Scope",
    "Send",
    "json_bytes",
    "parse_json",
    "parse_yaml",
    "read_body",
    "respond_json",
    "respond_raw",
    "truthy",
    "wait_disconnect",
]
