"""The admin ASGI app, called directly (no server): routes, auth, robustness."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio

from supervisor.admin.app import AdminApp
from supervisor.admin.responses import etag_matches
from supervisor.admin.stream import StreamHub
from supervisor.status_doc import ChildReport
from tests.adminserver import call, make_ctx
from tests.fakes.snapshot import FakeSnapshot, serve

TOKEN = "s3cr3t-token"


def bearer(token: str = TOKEN) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {token}".encode())]


async def test_healthz() -> None:
    status, headers, body = await call(AdminApp(make_ctx()), "GET", "/healthz")
    assert status == 200
    assert headers[b"content-type"] == b"application/json"
    assert msgspec.json.decode(body) == {"ok": True}


async def test_a_probe_is_answered_at_accept_only_as_its_connection_would_answer_it() -> None:
    # HTTP/1.1 without Host is a 400 on the connection (h11): not a 200 at accept.
    app = AdminApp(make_ctx())
    assert app.answer_at_once(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n") is None
    assert app.answer_at_once(b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n"
                              b"Connection: close\r\n\r\n") is None
    with_host = app.answer_at_once(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
                                   b"Connection: close\r\n\r\n")
    assert with_host is not None and with_host.startswith(b"HTTP/1.1 200 ")
    old = app.answer_at_once(b"GET /healthz HTTP/1.0\r\nConnection: close\r\n\r\n")
    assert old is not None and old.startswith(b"HTTP/1.1 200 ")


async def test_readyz_without_snapshot_then_with() -> None:
    ctx = make_ctx()
    app = AdminApp(ctx)
    status, _, body = await call(app, "GET", "/readyz")
    assert status == 503
    assert msgspec.json.decode(body) == {
        "ready": False, "reason": "no snapshot published yet", "consecutive_failures": 0,
    }
    ctx.revision.failed(None, "unavailable", "connection refused")
    status, _, body = await call(app, "GET", "/readyz")
    doc = msgspec.json.decode(body)
    assert status == 503
    assert "unavailable: connection refused" in doc["reason"]
    assert doc["consecutive_failures"] == 1
    serve(ctx.state, FakeSnapshot(7, 3))
    status, _, body = await call(app, "GET", "/readyz")
    assert status == 200
    assert msgspec.json.decode(body) == {"ready": True, "revision": 7, "generation": 3}


async def test_status_is_the_context_report() -> None:
    ctx = make_ctx()
    ctx.revision.observed(7)
    status, headers, body = await call(AdminApp(ctx), "GET", "/status")
    assert status == 200
    assert headers[b"cache-control"] == b"no-store"
    doc = msgspec.json.decode(body)
    expected = msgspec.json.decode(msgspec.json.encode(ctx.status()))
    # lag_s grows with the clock between the two reports.
    doc["revision"].pop("lag_s")
    expected["revision"].pop("lag_s")
    assert doc == expected
    assert doc["revision"]["desired"] == 7
    assert doc["children"]["convergence"]["state"] == "running"
    assert doc["fanout"]["ServiceDefinition"] == {
        "state": "watching", "last_error_class": None, "objects": 12,
    }


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, b"text/plain; version=0.0.4; charset=utf-8"),
        (b"application/openmetrics-text; version=1.0.0", b"application/openmetrics-text"),
        (b"text/plain; version=banana; escaping=???", b"text/plain"),
        (b"\xff\xfe;;;,,", b"text/plain"),
    ],
)
async def test_metrics_negotiates(accept: bytes | None, expected: bytes) -> None:
    ctx = make_ctx()
    ctx.metrics.stream_dropped.inc()
    headers = [(b"accept", accept)] if accept is not None else []
    status, response_headers, body = await call(AdminApp(ctx), "GET", "/metrics", headers)
    assert status == 200
    assert response_headers[b"content-type"].startswith(expected)
    assert b"supervisor_stream_dropped_clients_total 1.0" in body


async def test_snapshot_503_then_body_and_etag() -> None:
    ctx = make_ctx()
    app = AdminApp(ctx)
    status, _, body = await call(app, "GET", "/v1/snapshot")
    assert status == 503
    assert msgspec.json.decode(body)["error"] == "no_snapshot"
    serve(ctx.state, FakeSnapshot(7, 3, aliases={"chat": {}}))
    status, headers, body = await call(app, "GET", "/v1/snapshot")
    assert status == 200
    assert headers[b"etag"] == b'"7-3"'
    assert msgspec.json.decode(body) == {
        "revision": 7, "generation": 3, "aliases": {"chat": {}}, "keys": {},
    }


@pytest.mark.parametrize(
    ("if_none_match", "expected"),
    [
        (b'"7-3"', 304),
        (b'W/"7-3"', 304),
        (b'"1-1", "7-3"', 304),
        (b'"1-1",W/"7-3"', 304),
        (b"*", 304),
        (b'"7-2"', 200),
        (b"7-3", 200),  # unquoted: not an entity-tag
        (b'"', 200),
        (b"\x00\xff garbage", 200),
    ],
)
async def test_snapshot_if_none_match(if_none_match: bytes, expected: int) -> None:
    ctx = make_ctx()
    serve(ctx.state, FakeSnapshot(7, 3))
    status, headers, body = await call(
        AdminApp(ctx), "GET", "/v1/snapshot", [(b"if-none-match", if_none_match)]
    )
    assert status == expected
    assert headers[b"etag"] == b'"7-3"'
    if expected == 304:
        assert body == b""
        assert b"content-length" not in headers


async def test_if_none_match_split_across_headers() -> None:
    ctx = make_ctx()
    serve(ctx.state, FakeSnapshot(7, 3))
    status, _, _ = await call(
        AdminApp(ctx), "GET", "/v1/snapshot",
        [(b"if-none-match", b'"1-1"'), (b"if-none-match", b'"7-3"')],
    )
    assert status == 304


def test_etag_matches() -> None:
    assert etag_matches('W/"a"', '"a"')
    assert etag_matches('"a"', 'W/"a"')
    assert not etag_matches('"ab"', '"a"')
    assert etag_matches(" * ", '"a"')


async def test_head_has_length_and_no_body() -> None:
    status, headers, body = await call(AdminApp(make_ctx()), "HEAD", "/status")
    assert status == 200
    assert int(headers[b"content-length"]) > 0
    assert body == b""


async def test_unknown_route_and_wrong_method() -> None:
    app = AdminApp(make_ctx())
    status, _, body = await call(app, "GET", "/nope")
    assert status == 404
    assert msgspec.json.decode(body)["error"] == "not_found"
    for method in ("POST", "DELETE", "BREW", "", "G\x00T"):
        status, headers, body = await call(app, method, "/status")
        assert status == 405
        assert headers[b"allow"] == b"GET, HEAD"
        assert msgspec.json.decode(body)["error"] == "method_not_allowed"


async def test_stream_route_over_plain_http() -> None:
    status, headers, _ = await call(AdminApp(make_ctx()), "GET", "/v1/stream")
    assert status == 426
    assert headers[b"upgrade"] == b"websocket"


@pytest.mark.parametrize(
    "scope_headers",
    [
        [(b"authorization", b"Bearer s3cr3t-token\xff")],
        [(b"authorization", b"\xff\xfe")],
        [("authorization", "Bearer s3cr3t-token")],  # str, not bytes: ignored
        [(b"authorization",)],
        None,
        "garbage",
        [(b"authorization", b"Bearer s3cr3t-token"), (b"authorization", b"Bearer other")],
    ],
)
async def test_malformed_headers_never_crash(scope_headers: Any) -> None:
    app = AdminApp(make_ctx(token=TOKEN))
    scope = {"type": "http", "method": "GET", "path": "/status", "headers": scope_headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with trio.fail_after(5):
        await app(scope, receive, send)
    assert sent[0]["status"] == 401


async def test_malformed_scope_is_400() -> None:
    status, _, body = await call(AdminApp(make_ctx()), "GET", None)
    assert status == 400
    assert msgspec.json.decode(body)["error"] == "bad_request"


async def test_failing_handler_answers_500_json() -> None:
    def broken() -> dict[str, ChildReport]:
        raise RuntimeError("boom")

    status, _, body = await call(AdminApp(make_ctx(children=broken)), "GET", "/status")
    assert status == 500
    assert msgspec.json.decode(body)["error"] == "internal"
    assert b"boom" not in body


async def test_token_required_everywhere_but_healthz() -> None:
    app = AdminApp(make_ctx(token=TOKEN))
    for path in ("/readyz", "/status", "/metrics", "/v1/snapshot", "/v1/stream", "/nope"):
        status, headers, body = await call(app, "GET", path)
        assert status == 401, path
        assert headers[b"www-authenticate"] == b'Bearer realm="trio-supervisor"'
        assert msgspec.json.decode(body)["error"] == "unauthorized"
        assert TOKEN.encode() not in body
    status, _, _ = await call(app, "GET", "/healthz")
    assert status == 200
    status, headers, _ = await call(app, "GET", "/status", bearer("wrong"))
    assert status == 401
    assert b'error="invalid_token"' in headers[b"www-authenticate"]
    status, _, _ = await call(app, "GET", "/status", bearer())
    assert status == 200
    status, _, _ = await call(app, "GET", "/status", [(b"authorization", b"bearer " + TOKEN.encode())])
    assert status == 200
    status, _, _ = await call(app, "GET", "/status", [(b"authorization", b"Basic " + TOKEN.encode())])
    assert status == 401


async def ws_call(
    app: AdminApp, path: str, headers: list[tuple[bytes, bytes]]
) -> list[dict[str, Any]]:
    scope: dict[str, Any] = {"type": "websocket", "path": path, "headers": headers,
                             "client": ("127.0.0.1", 1234),
                             "extensions": {"websocket.http.response": {}}}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with trio.fail_after(5):
        await app(scope, receive, send)
    return sent


async def test_websocket_refused_before_accept() -> None:
    ctx = make_ctx(token=TOKEN)
    app = AdminApp(ctx, StreamHub(ctx.events, ctx.status, ctx.metrics))
    sent = await ws_call(app, "/v1/stream", [])
    assert sent[0]["type"] == "websocket.http.response.start"
    assert sent[0]["status"] == 401
    assert (b"www-authenticate", b'Bearer realm="trio-supervisor"') in sent[0]["headers"]
    assert msgspec.json.decode(sent[1]["body"])["error"] == "unauthorized"
    assert not any(m["type"] == "websocket.accept" for m in sent)
    # Unknown WebSocket path, authorized: 404; unauthorized: 401 (nothing revealed).
    assert (await ws_call(app, "/other", bearer()))[0]["status"] == 404
    assert (await ws_call(app, "/other", []))[0]["status"] == 401


async def test_websocket_without_hub_or_when_full_is_503() -> None:
    ctx = make_ctx()
    assert (await ws_call(AdminApp(ctx), "/v1/stream", []))[0]["status"] == 503
    from supervisor.admin.stream import StreamSettings

    hub = StreamHub(ctx.events, ctx.status, ctx.metrics, StreamSettings(max_clients=0))
    sent = await ws_call(AdminApp(ctx, hub), "/v1/stream", [])
    assert sent[0]["status"] == 503
    assert msgspec.json.decode(sent[1]["body"])["error"] == "too_many_clients"


async def test_snapshot_body_encoded_once_per_snapshot() -> None:
    encodes: list[int] = []

    class Counting(FakeSnapshot):
        def to_json(self) -> bytes:
            encodes.append(self.revision)
            return super().to_json()

    ctx = make_ctx()
    app = AdminApp(ctx)
    serve(ctx.state, Counting(1, 1))
    for _ in range(3):
        assert (await call(app, "GET", "/v1/snapshot"))[0] == 200
    serve(ctx.state, Counting(2, 2))
    status, headers, body = await call(app, "GET", "/v1/snapshot")
    assert (status, headers[b"etag"]) == (200, b'"2-2"')
    assert msgspec.json.decode(body)["revision"] == 2
    assert encodes == [1, 2]
