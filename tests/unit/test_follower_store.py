"""The follower store against an upstream served in-process (httpx.MockTransport).

The upstream here is a fake of the upstream replica's ``GET /v1/revision``
(signed statements made by :class:`tests.fakes.statements.Root` exactly as a
root signs them, ETag, If-None-Match): every refusal the store makes is checked
against real signed files, altered or replayed the way a proxy or a hub would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.errors import ControlPlaneError
from supervisor.controlplane.factory import open_store
from supervisor.controlplane.follower import ERROR_BODY_BYTES, FollowerStore
from supervisor.errors import ConfigError
from supervisor.sinks.lkg import encode_file, encode_header, format_verify_key, key_id_of
from supervisor.sinks.lkg.accepted import AcceptedStatements
from tests.fakes.statements import BODY, Root, gzip_bomb, statement_of

ROOT = Root()
OTHER = Root()
OTHER_BODY = BODY.replace(b"a.example", b"b.example")


class FakeUpstream:
    """Serves ``self.data``; counts full and 304 answers; ``respond`` overrides everything."""

    def __init__(self, data: bytes) -> None:
        self.data, self.status = data, 200
        self.full = self.not_modified = 0
        self.requests: list[httpx.Request] = []
        self.respond: object = None

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if callable(self.respond):
            response = self.respond(request)
            assert isinstance(response, httpx.Response)
            return response
        if self.status != 200:
            return httpx.Response(self.status, json={"error": "x", "detail": "none active"})
        try:
            etag = statement_of(self.data).etag()
        except (AssertionError, ValueError):  # altered or version 1 bytes: any tag will do
            etag = f'"{len(self.data)}"'
        if request.headers.get("if-none-match") == etag:
            self.not_modified += 1
            return httpx.Response(304, headers={"etag": etag})
        self.full += 1
        return httpx.Response(200, content=self.data, headers={"etag": etag})


def config_for(root: Root = ROOT, **cp: object) -> ControlPlaneConfig:
    return ControlPlaneConfig(url="http://upstream.test:9464",  # type: ignore[arg-type]
                              trusted_keys=[format_verify_key(root.key.verify_key)], **cp)


def store_for(upstream: FakeUpstream, root: Root = ROOT, *,
              accepted: AcceptedStatements | None = None, **cp: object) -> FollowerStore:
    return FollowerStore(config_for(root, **cp), max_schema_version=1, accepted=accepted,
                         transport=httpx.MockTransport(upstream.handle))


async def refusal(store: FollowerStore) -> ControlPlaneError:
    with pytest.raises(ControlPlaneError) as info:
        await store.observe()
    return info.value


async def test_accepts_a_signed_statement_then_revalidates_with_304() -> None:
    upstream = FakeUpstream(ROOT.sign(3, sequence=7))
    store = store_for(upstream)
    pointer = await store.observe()
    assert pointer is not None and (pointer.revision, pointer.sequence) == (3, 7)
    assert pointer.identity == "upstream:http://upstream.test:9464"
    assert pointer.statement is not None and pointer.statement.signed == upstream.data
    loaded = await store.hydrate()
    assert loaded is not None and loaded.body == BODY and loaded.id == 3
    assert await store.desired() == 3
    assert (upstream.full, upstream.not_modified) == (1, 1)
    # The conditional request is the verified statement's ETag; identity is asked for.
    last = upstream.requests[-1]
    assert last.headers["if-none-match"] == statement_of(upstream.data).etag()
    assert last.headers["accept-encoding"] == "identity"
    await store.aclose()


async def test_unknown_key_is_denied_and_names_no_revision() -> None:
    error = await refusal(store_for(FakeUpstream(OTHER.sign(3, 3))))
    assert error.reason == "denied" and error.revision is None
    assert "control_plane.trusted_keys" in str(error)


async def test_a_flipped_header_byte_is_denied_and_a_flipped_body_byte_corrupt() -> None:
    data = bytearray(ROOT.sign(3, 3))
    data[30] ^= 0x01  # inside the signed header
    assert (await refusal(store_for(FakeUpstream(bytes(data))))).reason == "denied"
    data = bytearray(ROOT.sign(3, 3))
    data[-2] ^= 0x01
    error = await refusal(store_for(FakeUpstream(bytes(data))))
    assert error.reason == "corrupt" and error.revision == 3


async def test_a_lower_sequence_is_a_rollback_and_an_older_revision_under_a_higher_one_is_not(
) -> None:
    upstream = FakeUpstream(ROOT.sign(5, sequence=5))
    store = store_for(upstream)
    assert (await store.observe()) is not None
    upstream.data = ROOT.sign(6, sequence=4)  # a newer id, replayed from an older intent
    error = await refusal(store)
    assert error.reason == "rollback" and error.revision is None
    assert "sequence 4" in str(error) and "sequence 5" in str(error)
    upstream.data = ROOT.sign(2, sequence=6)  # the operator's rollback to revision 2
    pointer = await store.observe()
    assert pointer is not None and (pointer.revision, pointer.sequence) == (2, 6)


async def test_the_same_sequence_with_another_body_is_corrupt() -> None:
    upstream = FakeUpstream(ROOT.sign(3, sequence=3))
    store = store_for(upstream)
    await store.observe()
    upstream.data = ROOT.sign(3, sequence=3, body=OTHER_BODY)
    assert (await refusal(store)).reason == "corrupt"
    # A refresh (same intent, later issued_at) is accepted; an earlier one is a replay.
    first = statement_of(ROOT.sign(3, sequence=3))
    upstream.data = ROOT.sign(3, sequence=3, issued_at=first.issued_at + timedelta(seconds=5))
    assert (await store.observe()) is not None
    upstream.data = ROOT.sign(3, sequence=3, issued_at=first.issued_at - timedelta(seconds=60))
    assert (await refusal(store)).reason == "rollback"


async def test_an_expired_statement_is_stale_also_when_the_upstream_answers_304() -> None:
    now = datetime.now(UTC)
    clock = [now]
    upstream = FakeUpstream(ROOT.sign(3, 3, issued_at=now, ttl_s=6))
    store = FollowerStore(config_for(), max_schema_version=1,
                          transport=httpx.MockTransport(upstream.handle), clock=lambda: clock[0])
    assert (await store.observe()) is not None
    clock[0] = now + timedelta(seconds=6)
    error = await refusal(store)
    assert error.reason == "stale" and upstream.not_modified == 1
    assert not error.retryable
    # A fresh statement from the root clears it.
    upstream.data = ROOT.sign(3, 3, issued_at=clock[0], ttl_s=6)
    assert (await store.observe()) is not None
    # Already expired on arrival: stale.
    upstream.data = ROOT.sign(4, 4, issued_at=now - timedelta(seconds=60), ttl_s=6)
    assert (await refusal(store)).reason == "stale"


async def test_a_version_1_file_carries_no_statement_and_is_stale() -> None:
    header = encode_header(revision=3, generation=1, schema_version=1,
                           created_at=datetime.now(UTC), body=BODY,
                           key_id=key_id_of(ROOT.key.verify_key))
    error = await refusal(store_for(FakeUpstream(encode_file(header, BODY, ROOT.key))))
    assert error.reason == "stale" and "format_version 1" in str(error)


async def test_the_highest_accepted_survives_a_restart_and_refuses_a_replay(
    tmp_path: Path
) -> None:
    path = str(tmp_path / "lkg.bin.accepted")
    old = ROOT.sign(1, sequence=1)
    upstream = FakeUpstream(ROOT.sign(3, sequence=3))
    store = store_for(upstream, accepted=AcceptedStatements(path))
    await store.observe()
    assert json.loads(Path(path).read_text())["sequence"] == 3
    # A new process (a new AcceptedStatements reads the file) against a replay of revision 1.
    upstream.data = old
    restarted = store_for(upstream, accepted=AcceptedStatements(path))
    assert (await refusal(restarted)).reason == "rollback"
    assert json.loads(Path(path).read_text())["sequence"] == 3  # never lowered


def test_a_garbled_accepted_file_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "lkg.bin.accepted"
    path.write_text("{not json")
    with pytest.raises(ConfigError) as info:
        AcceptedStatements(str(path))
    assert str(path) in str(info.value) and "remove" in str(info.value)


async def test_another_root_identity_is_accepted_only_when_issued_later() -> None:
    restored = Root(ROOT.key, identity="sqlite:2:99")  # the root's file restored from a backup
    now = datetime.now(UTC)
    upstream = FakeUpstream(ROOT.sign(3, sequence=9, issued_at=now))
    store = store_for(upstream)
    await store.observe()
    upstream.data = restored.sign(3, sequence=2, body=OTHER_BODY,
                                  issued_at=now - timedelta(seconds=1))
    assert (await refusal(store)).reason == "rollback"
    upstream.data = restored.sign(3, sequence=2, body=OTHER_BODY,
                                  issued_at=now + timedelta(seconds=1))
    loaded = await store.observe()
    assert loaded is not None and loaded.sequence == 2
    # And the old root's statements are now replays.
    upstream.data = ROOT.sign(4, sequence=10, issued_at=now)
    assert (await refusal(store)).reason == "rollback"


async def test_newer_schema_is_incompatible_and_oversize_is_denied() -> None:
    error = await refusal(store_for(FakeUpstream(ROOT.sign(2, 2, schema_version=9))))
    assert error.reason == "incompatible"
    big = b'{"schema_version": 1, "pad": "' + b"x" * 2000 + b'"}'
    error = await refusal(store_for(FakeUpstream(ROOT.sign(2, 2, body=big)),
                                    max_revision_bytes=1024))
    assert error.reason == "denied"


@pytest.mark.parametrize(("status", "reason"), [(503, "unavailable"), (401, "denied"),
                                                (404, "invalid")])
async def test_http_statuses_map_to_reasons(status: int, reason: str) -> None:
    upstream = FakeUpstream(b"")
    upstream.status = status
    error = await refusal(store_for(upstream))
    assert error.reason == reason
    assert error.retryable is (reason == "unavailable")


async def test_unreachable_upstream_is_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    store = FollowerStore(config_for(), max_schema_version=1,
                          transport=httpx.MockTransport(refuse))
    error = await refusal(store)
    assert error.reason == "unavailable" and error.retryable


async def test_a_non_ascii_etag_is_invalid_and_the_next_poll_still_works() -> None:
    upstream = FakeUpstream(ROOT.sign(3, 3))
    upstream.respond = lambda request: httpx.Response(
        200, content=upstream.data, headers=[(b"etag", b'"\xe9"')])
    store = store_for(upstream)
    error = await refusal(store)
    assert error.reason == "invalid" and "ETag" in str(error)
    upstream.respond = None
    assert (await store.observe()) is not None


async def test_any_content_encoding_but_identity_is_corrupt_and_never_inflated() -> None:
    upstream = FakeUpstream(ROOT.sign(3, 3))
    upstream.respond = lambda request: httpx.Response(
        200, content=gzip_bomb(), headers={"content-encoding": "gzip, gzip"})
    error = await refusal(store_for(upstream))
    assert error.reason == "corrupt" and "Content-Encoding" in str(error)


async def test_a_body_past_the_bound_is_refused_while_it_arrives() -> None:
    sent = [0]

    async def endless() -> AsyncIterator[bytes]:
        while True:
            sent[0] += 65536
            yield b"\0" * 65536

    upstream = FakeUpstream(b"")
    upstream.respond = lambda request: httpx.Response(200, content=endless())
    error = await refusal(store_for(upstream, max_revision_bytes=1024))
    assert error.reason == "denied"
    assert sent[0] < 2 * 65536 + 1024 + 65536 + 100_000  # stopped at the bound, not later


async def test_an_endless_error_body_is_read_at_most_4_kib() -> None:
    sent = [0]

    async def endless() -> AsyncIterator[bytes]:
        while True:
            sent[0] += 1024
            yield b"e" * 1024

    upstream = FakeUpstream(b"")
    upstream.respond = lambda request: httpx.Response(500, content=endless())
    error = await refusal(store_for(upstream))
    assert error.reason == "unavailable"
    assert sent[0] <= ERROR_BODY_BYTES + 1024
    assert len(str(error)) < 1000


async def test_a_slow_drip_ends_within_the_fetch_timeout(
    autojump_clock: trio.testing.MockClock
) -> None:
    async def drip() -> AsyncIterator[bytes]:
        for byte in ROOT.sign(3, 3):
            await trio.sleep(8)
            yield bytes([byte])

    upstream = FakeUpstream(b"")
    upstream.respond = lambda request: httpx.Response(200, content=drip())
    store = store_for(upstream, fetch_timeout_s=10.0)
    start = trio.current_time()
    error = await refusal(store)
    assert error.reason == "unavailable" and "fetch_timeout_s" in str(error)
    assert trio.current_time() - start == pytest.approx(10.0)


async def test_proxies_from_the_environment_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("ALL_PROXY", "http://proxy.invalid:3128")
    store = FollowerStore(config_for(), max_schema_version=1)
    assert store._client.trust_env is False
    assert not store._client._mounts  # no proxy transport mounted
    await store.aclose()


async def test_token_file_is_sent_and_publish_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    upstream = FakeUpstream(ROOT.sign(1, 1))
    store = store_for(upstream, token_file=str(token))
    await store.observe()
    assert [r.headers.get("authorization") for r in upstream.requests] == ["Bearer s3cret-token"]
    with pytest.raises(ControlPlaneError) as info:
        await store.publish(BODY, 1, None)
    assert info.value.reason == "invalid" and "upstream" in str(info.value)


def test_open_store_picks_the_follower_for_http_urls() -> None:
    store = open_store(config_for(), max_schema_version=1)
    assert isinstance(store, FollowerStore)


def test_a_bad_trusted_key_names_the_control_plane_key() -> None:
    with pytest.raises(ConfigError) as info:
        FollowerStore(ControlPlaneConfig(url="http://u.test:1", trusted_keys=["nope"]),
                      max_schema_version=1)
    assert info.value.path == "$.control_plane.trusted_keys[0]"


def test_the_accepted_file_is_0600_and_a_non_regular_one_refuses_to_start(tmp_path: Path
                                                                          ) -> None:
    path = tmp_path / "lkg.bin.accepted"
    accepted = AcceptedStatements(str(path))
    statement = statement_of(ROOT.sign(2, 2))
    accepted.accept(statement)
    assert path.stat().st_mode & 0o777 == 0o600
    assert AcceptedStatements(str(path)).highest == statement.without_bytes()
    directory = tmp_path / "dir.accepted"
    directory.mkdir()
    with pytest.raises(ConfigError) as info:
        AcceptedStatements(str(directory))
    assert "not a regular file" in str(info.value)


def test_an_unwritable_accepted_file_keeps_the_highest_in_memory(tmp_path: Path) -> None:
    from supervisor.sinks.lkg import CacheUnwritable

    accepted = AcceptedStatements(str(tmp_path / "gone" / "lkg.bin.accepted"))
    statement = statement_of(ROOT.sign(4, 4))
    with pytest.raises(CacheUnwritable):
        accepted.accept(statement)
    assert accepted.highest == statement


async def test_an_error_body_read_stops_at_exactly_4_kib() -> None:
    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"e" * 1000

    store = store_for(FakeUpstream(b""))
    response = httpx.Response(500, content=endless())
    assert len(await store._read_some(response)) == ERROR_BODY_BYTES
    short = httpx.Response(500, content=b"tiny")
    assert await store._read_some(short) == "tiny"
    await store.aclose()


async def test_the_size_bound_is_inclusive_for_the_body_and_its_framing() -> None:
    exact = b'{"schema_version": 1, "pad": "' + b"x" * (1024 - 32) + b'"}'
    assert len(exact) == 1024
    store = store_for(FakeUpstream(ROOT.sign(2, 2, body=exact)), max_revision_bytes=1024)
    assert (await store.observe()) is not None  # exactly the bound: accepted
    over = exact[:-2] + b'x"}'
    error = await refusal(store_for(FakeUpstream(ROOT.sign(3, 3, body=over)),
                                    max_revision_bytes=1024))
    assert error.reason == "denied"
    # A Content-Length over the bound is refused before a byte of the body is read.
    upstream = FakeUpstream(b"")
    upstream.respond = lambda request: httpx.Response(
        200, content=b"", headers={"content-length": str(1024 + 70_000 + 1)})
    error = await refusal(store_for(upstream, max_revision_bytes=1024))
    assert error.reason == "denied" and str(1024 + 70_000 + 1) in str(error)


@pytest.mark.parametrize("text", ["", "two words", "tab\there", "bell\x07"])
def test_a_token_file_must_hold_one_printable_token(tmp_path: Path, text: str) -> None:
    token = tmp_path / "token"
    token.write_text(text)
    with pytest.raises(ConfigError) as info:
        store_for(FakeUpstream(b""), token_file=str(token))
    assert info.value.path == "$.control_plane.token_file"


async def test_an_etag_at_the_length_bound_is_accepted_and_one_over_it_invalid() -> None:
    from supervisor.controlplane.follower import FollowerStore as Store

    data = ROOT.sign(3, 3)
    for length, ok in ((256, True), (257, False)):
        upstream = FakeUpstream(data)
        upstream.respond = lambda request, n=length: httpx.Response(
            200, content=data, headers={"etag": '"' + "a" * (n - 2) + '"'})
        store: Store = store_for(upstream)
        if ok:
            assert (await store.observe()) is not None
        else:
            assert (await refusal(store)).reason == "invalid"


async def test_revision_0_is_corrupt_and_a_5xx_boundary_is_unavailable() -> None:
    error = await refusal(store_for(FakeUpstream(ROOT.sign(0, 1))))
    assert error.reason == "corrupt"
    upstream = FakeUpstream(b"")
    upstream.status = 500
    assert (await refusal(store_for(upstream))).reason == "unavailable"
    upstream.status = 499
    assert (await refusal(store_for(upstream))).reason == "invalid"


@pytest.mark.parametrize(("extra", "reason"), [(0, "corrupt"), (1, "denied")])
async def test_the_raw_bound_is_the_body_bound_plus_the_largest_framing(
    extra: int, reason: str
) -> None:
    # magic 20, header length 4, header at most 64 KiB, signature 64.
    limit = 1024 + 20 + 4 + 65536 + 64
    upstream = FakeUpstream(b"")
    upstream.respond = lambda request: httpx.Response(200, content=b"\0" * (limit + extra))
    error = await refusal(store_for(upstream, max_revision_bytes=1024))
    assert error.reason == reason  # at the bound it is read (and is no cache file)


async def test_a_statement_issued_ahead_of_this_clock_is_refused_and_poisons_nothing(
    tmp_path: Path
) -> None:
    # The root's clock ran a year ahead for a moment: what it signed then must not become
    # the highest, or every later refresh (issued "earlier") and every new root identity
    # would be refused until that date, and the statement would look fresh for a year.
    now = datetime.now(UTC)
    path = str(tmp_path / "lkg.bin.accepted")
    upstream = FakeUpstream(ROOT.sign(3, sequence=3, issued_at=now + timedelta(days=365)))
    store = FollowerStore(config_for(), max_schema_version=1,
                          accepted=AcceptedStatements(path),
                          transport=httpx.MockTransport(upstream.handle), clock=lambda: now)
    error = await refusal(store)
    assert error.reason == "stale" and "ahead" in str(error)
    assert store.highest is None and not Path(path).exists()
    # The root's clock put right: its statement of the same intent is accepted.
    upstream.data = ROOT.sign(3, sequence=3, issued_at=now)
    pointer = await store.observe()
    assert pointer is not None and pointer.sequence == 3
    # A clock a few seconds ahead (ordinary skew) is no refusal.
    upstream.data = ROOT.sign(3, sequence=3, issued_at=now + timedelta(seconds=5))
    assert (await store.observe()) is not None


def test_a_missing_accepted_file_is_restored_only_from_a_verified_statement_passed_on(
    tmp_path: Path
) -> None:
    forward = tmp_path / "lkg.bin.upstream"
    trusted = [format_verify_key(ROOT.key.verify_key)]
    limit = 1 << 20
    # Signed by a key that is not trusted (or altered): nothing is restored.
    forward.write_bytes(OTHER.sign(3, sequence=3))
    accepted = AcceptedStatements(str(tmp_path / "lkg.bin.accepted"))
    assert accepted.restore_from(str(forward), trusted, limit=limit) is None
    assert accepted.highest is None
    # The root's genuine bytes: they become the highest, written at once.
    forward.write_bytes(ROOT.sign(3, sequence=3))
    restored = accepted.restore_from(str(forward), trusted, limit=limit)
    assert restored is not None and accepted.highest == restored
    assert json.loads((tmp_path / "lkg.bin.accepted").read_text())["sequence"] == 3
    # An accepted file that exists is never overridden by the forward file.
    forward.write_bytes(ROOT.sign(2, sequence=2))
    again = AcceptedStatements(str(tmp_path / "lkg.bin.accepted"))
    assert again.restore_from(str(forward), trusted, limit=limit) is None
    assert again.highest is not None and again.highest.sequence == 3
