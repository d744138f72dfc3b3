"""The follower store against an upstream served in-process (httpx.MockTransport).

The upstream here is a fake of the upstream replica's ``GET /v1/revision``
(signed bytes, ETag, If-None-Match): every refusal the store makes is checked
against real signed files, altered the way a proxy or a hub would alter them.
"""

from __future__ import annotations

import httpx
import nacl.signing
import pytest

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.errors import ControlPlaneError
from supervisor.controlplane.factory import open_store
from supervisor.controlplane.follower import FollowerStore
from supervisor.sinks.lkg import format_verify_key
from tests.signedrevision import BODY, KEY, signed

OTHER = nacl.signing.SigningKey.generate()


class FakeUpstream:
    """Serves ``self.data`` as revision ``self.revision``; counts full and 304 answers."""

    def __init__(self, data: bytes, revision: int) -> None:
        self.data, self.revision, self.status = data, revision, 200
        self.full = self.not_modified = 0
        self.auth: list[str | None] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.auth.append(request.headers.get("authorization"))
        if self.status != 200:
            return httpx.Response(self.status, json={"error": "x", "detail": "none active"})
        etag = f'"{self.revision}"'
        if request.headers.get("if-none-match") == etag:
            self.not_modified += 1
            return httpx.Response(304, headers={"etag": etag})
        self.full += 1
        return httpx.Response(200, content=self.data, headers={"etag": etag})


def store_for(upstream: FakeUpstream, trusted: nacl.signing.SigningKey = KEY,
              **cp: object) -> FollowerStore:
    config = ControlPlaneConfig(url="http://upstream.test:9464", **cp)  # type: ignore[arg-type]
    return FollowerStore(config, [format_verify_key(trusted.verify_key)], max_schema_version=1,
                         transport=httpx.MockTransport(upstream.handle))


async def refusal(store: FollowerStore) -> ControlPlaneError:
    with pytest.raises(ControlPlaneError) as info:
        await store.observe()
    return info.value


async def test_accepts_a_signed_revision_then_revalidates_with_304() -> None:
    upstream = FakeUpstream(signed(3), 3)
    store = store_for(upstream)
    pointer = await store.observe()
    assert pointer is not None and pointer.revision == 3
    assert pointer.identity == "upstream:http://upstream.test:9464"
    loaded = await store.hydrate()
    assert loaded is not None and loaded.body == BODY and loaded.id == 3
    assert await store.desired() == 3
    assert (upstream.full, upstream.not_modified) == (1, 1)
    await store.aclose()


async def test_unknown_key_is_denied_and_names_no_revision() -> None:
    error = await refusal(store_for(FakeUpstream(signed(3, key=OTHER), 3)))
    assert error.reason == "denied" and error.revision is None


async def test_a_flipped_header_byte_is_denied() -> None:
    data = bytearray(signed(3))
    data[30] ^= 0x01  # inside the signed header
    error = await refusal(store_for(FakeUpstream(bytes(data), 3)))
    assert error.reason == "denied"


async def test_a_flipped_body_byte_is_corrupt() -> None:
    data = bytearray(signed(3))
    data[-2] ^= 0x01
    error = await refusal(store_for(FakeUpstream(bytes(data), 3)))
    assert error.reason == "corrupt" and error.revision == 3


async def test_an_older_revision_after_a_newer_one_is_a_rollback() -> None:
    upstream = FakeUpstream(signed(5), 5)
    store = store_for(upstream)
    assert (await store.observe()) is not None
    upstream.data, upstream.revision = signed(4), 4
    error = await refusal(store)
    assert error.reason == "rollback" and error.revision == 4


async def test_newer_schema_is_incompatible_and_oversize_is_denied() -> None:
    error = await refusal(store_for(FakeUpstream(signed(2, schema_version=9), 2)))
    assert error.reason == "incompatible"
    big = b'{"schema_version": 1, "pad": "' + b"x" * 2000 + b'"}'
    error = await refusal(store_for(FakeUpstream(signed(2, body=big), 2),
                                    max_revision_bytes=1024))
    assert error.reason == "denied"


@pytest.mark.parametrize(("status", "reason"), [(503, "unavailable"), (401, "denied"),
                                                (404, "invalid")])
async def test_http_statuses_map_to_reasons(status: int, reason: str) -> None:
    upstream = FakeUpstream(b"", 1)
    upstream.status = status
    error = await refusal(store_for(upstream))
    assert error.reason == reason
    assert error.retryable is (reason == "unavailable")


async def test_unreachable_upstream_is_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    config = ControlPlaneConfig(url="http://upstream.test:9464")
    store = FollowerStore(config, [format_verify_key(KEY.verify_key)], max_schema_version=1,
                          transport=httpx.MockTransport(refuse))
    error = await refusal(store)
    assert error.reason == "unavailable" and error.retryable


async def test_token_file_is_sent_and_publish_is_refused(tmp_path: object) -> None:
    import pathlib

    token = pathlib.Path(str(tmp_path)) / "token"
    token.write_text("s3cret-token\n")
    upstream = FakeUpstream(signed(1), 1)
    store = store_for(upstream, token_file=str(token))
    await store.observe()
    assert upstream.auth == ["Bearer s3cret-token"]
    with pytest.raises(ControlPlaneError) as info:
        await store.publish(BODY, 1, None)
    assert info.value.reason == "invalid" and "upstream" in str(info.value)


def test_open_store_picks_the_follower_for_http_urls() -> None:
    store = open_store(ControlPlaneConfig(url="https://hub.example:9464"), max_schema_version=1,
                       trusted_keys=[format_verify_key(KEY.verify_key)])
    assert isinstance(store, FollowerStore)


async def test_accepted_bytes_are_forwarded_unchanged_and_refused_ones_are_not(
    tmp_path: object
) -> None:
    import pathlib

    forward = pathlib.Path(str(tmp_path)) / "lkg.bin.upstream"
    data = signed(2)
    upstream = FakeUpstream(data, 2)
    config = ControlPlaneConfig(url="http://upstream.test:9464")
    store = FollowerStore(config, [format_verify_key(KEY.verify_key)], max_schema_version=1,
                          transport=httpx.MockTransport(upstream.handle),
                          forward_to=str(forward))
    await store.observe()
    assert forward.read_bytes() == data
    upstream.data, upstream.revision = signed(3, key=OTHER), 3
    error = await refusal(store)
    assert error.reason == "denied"
    assert forward.read_bytes() == data
