"""render_status and the URL helpers of the status/watch client."""

from __future__ import annotations

import httpx
import pytest
import trio

from supervisor.admin.client import converge_url, fetch_status, stream_url
from supervisor.admin.errors import AdminUnreachable
from supervisor.admin.status_view import render_status, unhealthy

STATUS_EXAMPLE = {
    "revision": {
        "desired": 7, "loaded": 7, "active": 7, "generation": 3,
        "source": "control_plane", "lag_s": 0.0, "last_convergence_s": 0.004,
        "consecutive_failures": 0,
        "last_rejection": {"revision": 6, "reason": "projection",
                           "detail": "key team-a names unknown alias x",
                           "at": "2025-01-01T00:00:00Z"},
    },
    "children": {
        "convergence": {"state": "running", "restarts": 0, "last_error": None},
        "listen": {"state": "backoff", "restarts": 2, "last_error": "OperationalError: down\nmore"},
    },
    "fanout": {
        "ServiceDefinition": {"state": "watching", "last_error_class": None, "objects": 12},
        "Workflow": {"state": "preflight", "last_error_class": "schema_skew", "objects": 0},
    },
    "leadership": {"role": "standby", "holder": "vm-1_812_5f2c9a1e",
                   "lease": "trio-supervisor/trio-supervisor-fanout"},
}


def test_render_status_contract_example() -> None:
    text = render_status(STATUS_EXAMPLE)
    lines = text.splitlines()
    assert lines[0] == "revision"
    assert "desired 7  loaded 7  active 7  generation 3  source control_plane" in text
    assert "lag 0.000 s  last convergence 0.004 s  consecutive failures 0" in text
    assert "last rejection: revision 6 (projection) at 2025-01-01T00:00:00Z: key team-a" in text
    assert "children" in lines and "fanout" in lines
    header = next(line for line in lines if line.strip().startswith("NAME"))
    assert header.split() == ["NAME", "STATE", "RESTARTS", "LAST", "ERROR"]
    row = next(line for line in lines if line.strip().startswith("listen"))
    assert row.split()[:3] == ["listen", "backoff", "2"]
    assert "OperationalError: down more" in row  # one line per row
    kinds = [line.split()[:4] for line in lines if line.strip().startswith(("Service", "Work"))]
    assert kinds == [["ServiceDefinition", "watching", "12", "-"],
                     ["Workflow", "preflight", "0", "schema_skew"]]
    assert lines[-1] == ("leadership: standby  holder vm-1_812_5f2c9a1e  lease "
                         "trio-supervisor/trio-supervisor-fanout")
    # Columns line up.
    table = [line for line in lines if line.strip().startswith(("NAME", "convergence", "listen"))]
    assert len({line.index(line.split()[1]) for line in table}) == 1


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"revision": None, "children": [], "fanout": "x"},
        {"revision": {"last_rejection": "odd"}, "children": {"a": None}, "fanout": {"K": 3}},
    ],
)
def test_render_status_tolerates_odd_documents(doc: dict[str, object]) -> None:
    text = render_status(doc)
    assert text.startswith("revision\n")
    assert "desired -" in text


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://h:1", "ws://h:1/v1/stream"),
        ("http://h:1/", "ws://h:1/v1/stream"),
        ("h:1", "ws://h:1/v1/stream"),
        ("https://h:1", "wss://h:1/v1/stream"),
        ("ws://h:1/v1/stream", "ws://h:1/v1/stream"),
        ("http://h:1/v1/stream", "ws://h:1/v1/stream"),
    ],
)
def test_stream_url(base: str, url: str) -> None:
    assert stream_url(base) == url


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://h:1", "http://h:1/v1/converge"),
        ("h:1/", "http://h:1/v1/converge"),
        ("https://h:1", "https://h:1/v1/converge"),
        ("ws://h:1/v1/stream", "http://h:1/v1/converge"),
        ("wss://h:1/v1/stream/", "https://h:1/v1/converge"),
        ("ws://h:1", "http://h:1/v1/converge"),
        ("http://h:1/v1/stream", "http://h:1/v1/converge"),
        ("http://h:1/v1/converge", "http://h:1/v1/converge"),
    ],
)
def test_converge_url_from_any_form_of_a_replica_address(base: str, url: str) -> None:
    """``publish --wait`` nudges a replica named by its stream URL on its HTTP address."""
    assert converge_url(base) == url


@pytest.mark.parametrize(
    ("base", "stream", "converge"),
    [
        # A ws URL naming only the replica: converge_url maps it, and the
        # stream must not go to "/" (a 404 handshake until --timeout).
        ("ws://h:1", "ws://h:1/v1/stream", "http://h:1/v1/converge"),
        ("wss://h:1/", "wss://h:1/v1/stream", "https://h:1/v1/converge"),
        ("ws://[::1]:1", "ws://[::1]:1/v1/stream", "http://[::1]:1/v1/converge"),
        # Schemes are case-insensitive (RFC 3986 3.1).
        ("WS://h:1/v1/stream", "ws://h:1/v1/stream", "http://h:1/v1/converge"),
        ("WSS://h:1", "wss://h:1/v1/stream", "https://h:1/v1/converge"),
        ("HTTP://h:1", "ws://h:1/v1/stream", "http://h:1/v1/converge"),
        ("Https://h:1/", "wss://h:1/v1/stream", "https://h:1/v1/converge"),
    ],
)
def test_stream_and_converge_urls_reach_the_same_replica(base: str, stream: str,
                                                         converge: str) -> None:
    """``publish --wait --url`` follows the stream and nudges the same replica."""
    assert (stream_url(base), converge_url(base)) == (stream, converge)


@pytest.mark.parametrize(
    ("base", "stream", "converge"),
    [
        # A path prefix (a replica behind a reverse proxy) is kept; a query with it.
        ("http://h:1/replica-a/", "ws://h:1/replica-a/v1/stream",
         "http://h:1/replica-a/v1/converge"),
        ("wss://h:1/replica-a/v1/stream?x=1", "wss://h:1/replica-a/v1/stream?x=1",
         "https://h:1/replica-a/v1/converge?x=1"),
    ],
)
def test_a_path_prefix_names_the_replica_too(base: str, stream: str, converge: str) -> None:
    assert (stream_url(base), converge_url(base)) == (stream, converge)


@pytest.mark.parametrize(("base", "reason"), [
    ("http://[::1", "not a URL (Invalid port: ':1')"),
    ("ws://h:99999", "port 99999 is not between 1 and 65535"),
])
async def test_an_address_that_is_not_a_url_is_refused_as_unreachable(base: str,
                                                                      reason: str) -> None:
    """httpx's InvalidURL (not an httpx.HTTPError) becomes ours, chained, never a traceback."""
    for call in (stream_url, converge_url):
        with pytest.raises(AdminUnreachable) as raised:
            call(base)
        assert (raised.value.url, raised.value.reason) == (base, reason)
    with pytest.raises(AdminUnreachable) as raised, trio.fail_after(5):
        await fetch_status(base)
    assert raised.value.reason == reason
    if base.startswith("http://["):
        assert isinstance(raised.value.__cause__, httpx.InvalidURL)


def test_render_status_shows_control_plane_up() -> None:
    up = {**STATUS_EXAMPLE, "revision": {**STATUS_EXAMPLE["revision"],
                                           "control_plane_up": False,
                                           "last_error": "unavailable: connection refused"}}
    text = render_status(up)
    assert "control plane up NO  last error unavailable: connection refused" in text
    assert "control plane up -" in render_status({})


def test_unhealthy_names_not_ready_and_failed_children() -> None:
    assert unhealthy(STATUS_EXAMPLE) == []  # backoff is not failed: it is being restarted
    not_ready = {"revision": {"active": None}, "children": {}}
    assert unhealthy(not_ready) == ["not ready: no active snapshot"]
    failed = {**STATUS_EXAMPLE, "children": {"listen": {"state": "failed"}}}
    assert unhealthy(failed) == ["child listen has failed"]
    assert unhealthy({}) == ["not ready: no active snapshot"]
