"""Watch lines from the API server, whatever their bytes: an event or a refusal with a reason.

Properties (hypothesis) of the two parsers a watch's bytes go through: the
stream's line splitter (:class:`~supervisor.kube.wire.WatchStream`, over any
chunking, a line over its bound refused) and the informer's line handler
(:meth:`~supervisor.kube.watching.Informer.handle_line`). No other exception
gets out, and every refusal carries a fan-out reason label.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from typing import Any

import httpx
import msgspec
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor import reasons
from supervisor.fanout.preflight import failure_class
from supervisor.kube.client import KubeClient
from supervisor.kube.config import KubeSettings
from supervisor.kube.errors import DecodeError, KubeError, TooLargeResponse
from supervisor.kube.models import PartialObject, Resource
from supervisor.kube.watching import Informer
from supervisor.kube.wire import ResponseBody, WatchStream

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RESOURCE = Resource("platform.trio-supervisor.dev", "v1", "servicedefinitions",
                    "ServiceDefinition")


class Recorder:
    """The informer's handler: what it was told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    async def on_list(self, items: Mapping[str, PartialObject], skewed: set[str]) -> None:
        self.told.append(("list", ""))

    def on_upsert(self, obj: PartialObject, name: str) -> None:
        self.told.append(("upsert", name))

    def on_delete(self, name: str) -> None:
        self.told.append(("delete", name))

    def on_skewed(self, name: str, error: DecodeError) -> None:
        self.told.append(("skewed", name))


async def _no_settings() -> KubeSettings:
    raise AssertionError("a line is handled without a request")


def informer(handler: Recorder) -> Informer[PartialObject]:
    found: Informer[PartialObject] = Informer(
        KubeClient(_no_settings), RESOURCE, PartialObject, "ns", handler,
        name_of=lambda obj: obj.metadata.name)
    found.resource_version = "10"
    return found


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)
rvs = st.one_of(st.text(max_size=8), st.integers(-5, 30).map(str), st.integers(), st.none())
metadata = st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.text(max_size=8), st.integers()),
    "resourceVersion": rvs,
    "labels": st.one_of(st.dictionaries(st.text(max_size=4), st.text(max_size=4)), json_values),
})
objects = st.one_of(json_values, st.fixed_dictionaries({"metadata": metadata}, optional={
    "code": st.integers(-1000, 100000), "reason": json_values, "message": json_values,
    "details": json_values, "kind": st.sampled_from(["Status", "ServiceDefinition"])}))
events = st.fixed_dictionaries({}, optional={
    "type": st.one_of(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]),
                      json_values),
    "object": objects,
})
lines = st.one_of(st.binary(max_size=300), events.map(lambda e: json.dumps(e).encode()),
                  json_values.map(lambda v: json.dumps(v).encode()))


@PROPERTY
@given(lines)
def test_any_watch_line_is_an_event_or_a_refusal_with_a_reason(line: bytes) -> None:
    handler = Recorder()
    watched = informer(handler)
    try:
        watched.handle_line(line)
    except KubeError as exc:
        assert failure_class(exc) in reasons.FANOUT_ERROR_CLASSES
        assert str(exc)
    assert len(handler.told) <= 1
    assert watched.resource_version is not None


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = iter(chunks)

    def __aiter__(self) -> Chunks:
        return self

    async def __anext__(self) -> bytes:
        await trio.lowlevel.checkpoint()
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None


MAX_LINE = 64


async def _split(chunks: list[bytes]) -> list[bytes]:
    stream = WatchStream(httpx.Response(200, stream=Chunks(chunks)), 5.0, "/x",
                         max_line=MAX_LINE)
    found: list[bytes] = []
    try:
        while (line := await stream.next_line()) is not None:
            found.append(line)
    finally:
        await stream.aclose()
    return found


@PROPERTY
@given(st.lists(st.binary(max_size=100), max_size=12))
def test_any_chunking_gives_the_lines_or_refuses_one_over_its_bound(chunks: list[bytes]) -> None:
    data = b"".join(chunks)
    want = [line for line in data.split(b"\n") if line.strip()]
    try:
        got = trio.run(_split, chunks)
    except TooLargeResponse as exc:
        assert failure_class(exc) == reasons.TOO_LARGE
        assert any(len(line) > MAX_LINE for line in data.split(b"\n"))
        return
    assert got == want
    assert all(len(line) <= MAX_LINE for line in got)


def test_a_line_over_its_bound_is_refused_before_it_is_held_whole() -> None:
    # Chunks of 64 bytes and no newline: refused at the second, the one past the bound.
    pulled = 0
    at_refusal = 0

    class Endless(Chunks):
        async def __anext__(self) -> bytes:
            nonlocal pulled
            pulled += 1
            await trio.lowlevel.checkpoint()
            return b"x" * MAX_LINE

    async def main() -> None:
        stream = WatchStream(httpx.Response(200, stream=Endless([])), 5.0, "/x",
                             max_line=MAX_LINE)
        nonlocal at_refusal
        with pytest.raises(TooLargeResponse, match="more than 64 bytes"):
            await stream.next_line()
        at_refusal = pulled
        await stream.aclose()

    trio.run(main)
    assert at_refusal == 2


@pytest.mark.parametrize("line", [b"{", b'{"type": "ADDED"}', b"\xff\xfe", b"[]"])
def test_lines_that_are_not_events_are_refused_as_schema_skew(line: bytes) -> None:
    with pytest.raises(KubeError) as refused:
        informer(Recorder()).handle_line(line)
    assert failure_class(refused.value) == reasons.SCHEMA_SKEW


def test_an_error_event_is_refused_with_its_status() -> None:
    status: dict[str, Any] = {"kind": "Status", "code": 503, "reason": "ServiceUnavailable",
                              "message": "etcd"}
    with pytest.raises(KubeError) as refused:
        informer(Recorder()).handle_line(msgspec.json.encode({"type": "ERROR",
                                                              "object": status}))
    assert failure_class(refused.value) == reasons.SERVER_ERROR


async def test_a_gzip_encoded_body_is_read_decoded_and_a_plain_one_as_sent() -> None:
    text = b'{"kind": "DeploymentList", "items": []}'
    packed = gzip.compress(text)
    encoded = httpx.Response(200, headers={"Content-Encoding": "gzip"},
                             stream=Chunks([packed[:10], packed[10:]]))
    plain = httpx.Response(200, stream=Chunks([text[:7], text[7:]]))
    with trio.fail_after(5):
        for response in (encoded, plain):
            body = ResponseBody(response, "GET /x")
            try:
                assert await body.read(1024, 5.0) == text
            finally:
                await body.aclose()
