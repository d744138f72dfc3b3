"""The follower store against an upstream served in-process (httpx.MockTransport).

The upstream here is a fake of the upstream replica's ``GET /v1/revision``
(signed statements made by :class:`tests.fakes.statements.Root` exactly as a
root signs them, ETag, If-None-Match): every refusal the store makes is checked
against real signed files, altered or replayed the way a proxy or a hub would.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.errors import ControlPlaneError
from supervisor.controlplane.factory import open_admin, open_source
from supervisor.controlplane.follower import ERROR_BODY_BYTES, FollowerStore, forward_path
from supervisor.errors import ConfigError
from supervisor.sinks.lkg import encode_file, encode_header, format_verify_key, key_id_of
from supervisor.sinks.lkg.accepted import AcceptedStatements, write_reset
from tests.fakes.statements import BODY, HostileUpstream, Root, gzip_bomb, statement_of

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
    assert (await store.observe()).revision == 3
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
    # What an upstream serves is its statement, never called a cache of ours.
    assert "upstream statement" in str(error) and "last-known-good" not in str(error)


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
    # A refresh (same intent, later issued_at) is accepted; an earlier one (a sibling
    # root's) is no refusal, and the later-expiring statement is the one kept.
    first = statement_of(ROOT.sign(3, sequence=3))
    later = ROOT.sign(3, sequence=3, issued_at=first.issued_at + timedelta(seconds=5))
    upstream.data = later
    assert (await store.observe()) is not None
    upstream.data = ROOT.sign(3, sequence=3, issued_at=first.issued_at - timedelta(seconds=60))
    pointer = await store.observe()
    assert pointer.statement is not None and pointer.statement.signed == later
    assert store.highest is not None and store.highest.etag() == statement_of(later).etag()


async def test_a_refresh_expiring_before_the_held_statement_is_not_downloaded_at_every_poll(
) -> None:
    # The root's statement_ttl_s was shortened: its refreshes of the same intent
    # expire before the statement held, which stays; the body comes once, not per poll.
    held = ROOT.sign(3, sequence=3, ttl_s=86400.0)
    first = statement_of(held)
    upstream = FakeUpstream(held)
    store = store_for(upstream)
    await store.observe()
    upstream.data = ROOT.sign(3, sequence=3, issued_at=first.issued_at + timedelta(seconds=30),
                              ttl_s=60.0)
    for _ in range(3):
        pointer = await store.observe()
        assert pointer.statement is not None and pointer.statement.etag() == first.etag()
    assert (upstream.full, upstream.not_modified) == (2, 2)


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
    assert str(path) in str(info.value) and "follower reset" in str(info.value)


async def test_another_root_identity_is_denied_until_a_reset_or_root_identity(
    tmp_path: Path
) -> None:
    restored = Root(ROOT.key, identity="sqlite:2:99")  # the root's file restored from a backup
    now = datetime.now(UTC)
    path = str(tmp_path / "lkg.bin.accepted")
    upstream = FakeUpstream(ROOT.sign(3, sequence=9, issued_at=now))
    store = store_for(upstream, accepted=AcceptedStatements(path))
    await store.observe()
    upstream.data = restored.sign(3, sequence=2, body=OTHER_BODY,
                                  issued_at=now + timedelta(seconds=1))  # issued later
    error = await refusal(store)
    assert error.reason == "denied"
    assert "'sqlite:2:99'" in str(error) and f"{ROOT.identity!r}" in str(error)
    # follower reset, written while the store runs: the next statement is taken and pins.
    write_reset(path)
    loaded = await store.observe()
    assert loaded is not None and loaded.sequence == 2
    assert json.loads(Path(path).read_text())["root"] == "sqlite:2:99"
    upstream.data = ROOT.sign(4, sequence=10, issued_at=now + timedelta(seconds=2))
    assert (await refusal(store)).reason == "denied"
    # A restart after a reset restores nothing; root_identity re-pins without a reset.
    write_reset(path)
    assert AcceptedStatements(path).highest is None and AcceptedStatements(path).reset
    upstream.data = restored.sign(3, sequence=2, body=OTHER_BODY)
    await store_for(upstream, accepted=AcceptedStatements(path)).observe()
    upstream.data = ROOT.sign(4, sequence=1)
    repinned = store_for(upstream, accepted=AcceptedStatements(path),
                         root_identity=ROOT.identity)
    pointer = await repinned.observe()
    assert pointer.sequence == 1 and json.loads(Path(path).read_text())["root"] == ROOT.identity


async def test_an_unwritten_accepted_file_is_written_again_at_the_next_304(
    tmp_path: Path
) -> None:
    path = tmp_path / "lkg.bin.accepted"
    upstream = FakeUpstream(ROOT.sign(3, sequence=3))
    store = store_for(upstream, accepted=AcceptedStatements(str(path)))
    path.mkdir()  # the atomic rename fails, as a write on a full disk does
    await store.observe()
    assert path.is_dir()
    path.rmdir()
    await store.observe()  # 304
    assert upstream.not_modified == 1
    assert json.loads(Path(path).read_text())["sequence"] == 3


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
        sent[0] += 1
        yield b"e"  # a short first chunk: the count is of bytes, not of chunks
        while True:
            sent[0] += 1024
            yield b"e" * 1024

    upstream = FakeUpstream(b"")
    upstream.respond = lambda request: httpx.Response(500, content=endless())
    error = await refusal(store_for(upstream))
    assert error.reason == "unavailable"
    assert sent[0] <= ERROR_BODY_BYTES + 1 + 1024
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


async def test_the_token_file_is_sent(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    upstream = FakeUpstream(ROOT.sign(1, 1))
    store = store_for(upstream, token_file=str(token))
    await store.observe()
    assert [r.headers.get("authorization") for r in upstream.requests] == ["Bearer s3cret-token"]


def test_an_http_url_is_a_follower_source_and_has_no_admin() -> None:
    assert isinstance(open_source(config_for(), max_schema_version=1), FollowerStore)
    with pytest.raises(ControlPlaneError) as info:
        open_admin(config_for(), max_schema_version=1)
    assert info.value.reason == "invalid"
    assert "follows http://upstream.test:9464" in str(info.value)
    assert "run against the upstream's control plane" in str(info.value)


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
    with pytest.raises(CacheUnwritable) as info:
        accepted.accept(statement)
    assert accepted.highest == statement
    assert str(info.value).endswith("could not be written: No such file or directory")
    assert not accepted.durable
    # Once the directory exists, the next sync writes it from memory.
    (tmp_path / "gone").mkdir()
    assert accepted.sync() is False and accepted.durable
    assert AcceptedStatements(str(tmp_path / "gone" / "lkg.bin.accepted")).highest == statement


async def test_an_error_body_read_stops_at_exactly_4_kib() -> None:
    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"e" * 1000

    store = store_for(FakeUpstream(b""))
    response = httpx.Response(500, content=endless())
    assert len(await store._read_some(response)) == ERROR_BODY_BYTES == 4096
    short = httpx.Response(500, content=b"tiny")
    assert await store._read_some(short) == "tiny"
    await store.aclose()


async def test_an_error_body_read_pulls_no_chunk_past_its_4_kib() -> None:
    pulled = [0]

    async def chunks(sizes: list[int]) -> AsyncIterator[bytes]:
        for size in sizes:
            pulled[0] += 1
            yield b"e" * size

    store = store_for(FakeUpstream(b""))
    # Four chunks make 4 KiB: the fifth is never asked for.
    response = httpx.Response(500, content=chunks([1024] * 8))
    assert len(await store._read_some(response)) == ERROR_BODY_BYTES and pulled[0] == 4
    # One byte short of 4 KiB after the first chunk: the next one completes it.
    pulled[0] = 0
    response = httpx.Response(500, content=chunks([ERROR_BODY_BYTES - 1, 1, 1]))
    assert len(await store._read_some(response)) == ERROR_BODY_BYTES and pulled[0] == 2
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


def test_the_forward_file_of_another_root_than_root_identity_restores_nothing(
    tmp_path: Path
) -> None:
    forward = tmp_path / "lkg.bin.upstream"
    forward.write_bytes(ROOT.sign(3, sequence=3))
    trusted = [format_verify_key(ROOT.key.verify_key)]
    accepted = AcceptedStatements(str(tmp_path / "lkg.bin.accepted"))
    assert accepted.restore_from(str(forward), trusted, limit=1 << 20,
                                 root_identity="postgresql:7:1") is None
    assert accepted.highest is None
    assert accepted.restore_from(str(forward), trusted, limit=1 << 20,
                                 root_identity=ROOT.identity) is not None


async def test_hydrate_fetches_when_nothing_was_observed_yet() -> None:
    upstream = FakeUpstream(ROOT.sign(3, sequence=3))
    loaded = await store_for(upstream).hydrate()
    assert loaded is not None and (loaded.id, loaded.body) == (3, BODY)
    assert upstream.full == 1


def test_the_forwarded_statement_is_kept_beside_the_cache() -> None:
    assert forward_path("/var/lib/s/lkg.bin") == "/var/lib/s/lkg.bin.upstream"
    assert forward_path(None) is None


@pytest.mark.parametrize("content", [None, b"\xff\xfe token"])
def test_an_unreadable_token_file_names_the_key(tmp_path: Path, content: bytes | None) -> None:
    token = tmp_path / "token"
    if content is not None:
        token.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        store_for(FakeUpstream(b""), token_file=str(token))
    assert info.value.path == "$.control_plane.token_file"
    assert f"cannot read {token}" in str(info.value)


async def test_a_token_file_of_4_kib_is_read_whole_and_a_longer_one_refused(
    tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("a" * 4095 + "\n")
    upstream = FakeUpstream(ROOT.sign(1, 1))
    await store_for(upstream, token_file=str(token)).observe()
    assert upstream.requests[0].headers["authorization"] == "Bearer " + "a" * 4095
    # One byte more is refused, never cut to a token the upstream would answer 401.
    token.write_text("a" * 4096 + "b" * 100)
    with pytest.raises(ConfigError) as info:
        store_for(FakeUpstream(b""), token_file=str(token))
    assert info.value.path == "$.control_plane.token_file"
    assert "4096 bytes" in info.value.reason and str(token) in info.value.reason


@pytest.mark.parametrize("text", ["tökén", "token\u00a0here", "\u2028token"])
def test_a_non_ascii_token_file_is_a_config_error_naming_the_key(tmp_path: Path,
                                                                 text: str) -> None:
    # httpx cannot send it in a header: refused at start, not a UnicodeEncodeError.
    token = tmp_path / "token"
    token.write_text(text)
    with pytest.raises(ConfigError) as info:
        store_for(FakeUpstream(b""), token_file=str(token))
    assert info.value.path == "$.control_plane.token_file"
    assert "printable ASCII" in info.value.reason and text not in str(info.value)


@pytest.mark.parametrize(("fetch_timeout_s", "connect_s"), [(30.0, 5.0), (2.0, 2.0)])
async def test_the_connect_timeout_is_5_s_or_the_fetch_timeout_when_shorter(
    fetch_timeout_s: float, connect_s: float
) -> None:
    upstream = FakeUpstream(ROOT.sign(1, 1))
    await store_for(upstream, fetch_timeout_s=fetch_timeout_s).observe()
    timeouts = upstream.requests[0].extensions["timeout"]
    assert timeouts == {"connect": connect_s, "read": fetch_timeout_s,
                        "write": fetch_timeout_s, "pool": fetch_timeout_s}


async def test_aclose_closes_the_transport_to_the_upstream() -> None:
    class ClosingTransport(httpx.MockTransport):
        closed = False

        async def aclose(self) -> None:
            self.closed = True

    transport = ClosingTransport(FakeUpstream(ROOT.sign(1, 1)).handle)
    store = FollowerStore(config_for(), max_schema_version=1, transport=transport)
    await store.observe()
    assert not transport.closed
    await store.aclose()
    assert transport.closed


@pytest.mark.parametrize(("raised", "reason", "said"), [
    (httpx.ConnectError("refused " + "x" * 2000), "unavailable",
     "unreachable: ConnectError: refused " + "x" * 2000),
    (ValueError("bad header value " + "y" * 2000), "invalid",
     "sent a malformed answer: ValueError: bad header value " + "y" * 2000),
    (ConnectionResetError(104, "Connection reset by peer"), "unavailable",
     "unreachable: ConnectionResetError: Connection reset by peer"),  # strerror, not repr
])
async def test_a_transport_error_maps_to_its_reason_in_at_most_500_characters(
    raised: Exception, reason: str, said: str
) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise raised

    upstream = FakeUpstream(b"")
    upstream.respond = fail
    error = await refusal(store_for(upstream))
    assert error.reason == reason
    assert str(error) == f"upstream http://upstream.test:9464/v1/revision {said}"[:500]


async def test_a_malformed_etag_is_quoted_to_its_first_40_characters() -> None:
    value = '"' + "".join(chr(ord("a") + i % 26) for i in range(300)) + '"'
    upstream = FakeUpstream(ROOT.sign(3, 3))
    upstream.respond = lambda request: httpx.Response(
        200, content=upstream.data, headers={"etag": value})
    error = await refusal(store_for(upstream))
    assert error.reason == "invalid" and f"({value[:40]!a})" in str(error)


async def test_a_refused_content_encoding_is_quoted_to_80_characters() -> None:
    encodings = ", ".join(f"x-enc{i}" for i in range(40))
    upstream = FakeUpstream(ROOT.sign(3, 3))
    upstream.respond = lambda request: httpx.Response(
        200, content=upstream.data, headers={"content-encoding": encodings})
    error = await refusal(store_for(upstream))
    assert error.reason == "corrupt"
    assert f"Content-Encoding {ascii(encodings)[:80]} after" in str(error)


async def test_an_error_body_is_shown_on_one_line_cut_at_300_characters() -> None:
    body = "first line\n\n   " + "".join(chr(ord("a") + i % 26) for i in range(1000))
    upstream = FakeUpstream(b"")
    upstream.respond = lambda request: httpx.Response(502, content=body.encode())
    error = await refusal(store_for(upstream))
    assert error.reason == "unavailable"
    assert str(error).endswith("answered 502: " + " ".join(body.split())[:300])


async def test_a_statement_issued_60_s_ahead_is_accepted_and_61_s_ahead_refused() -> None:
    now = datetime.now(UTC)
    for ahead_s, accepted in ((60, True), (61, False)):
        upstream = FakeUpstream(ROOT.sign(3, 3, issued_at=now + timedelta(seconds=ahead_s)))
        store = FollowerStore(config_for(), max_schema_version=1, clock=lambda: now,
                              transport=httpx.MockTransport(upstream.handle))
        if accepted:
            assert (await store.observe()) is not None
        else:
            assert (await refusal(store)).reason == "stale"


async def test_a_newer_file_format_is_invalid_not_a_refused_statement() -> None:
    now = datetime.now(UTC)
    statement = statement_of(ROOT.sign(3, 3, issued_at=now))
    header = encode_header(revision=3, generation=1, schema_version=1, created_at=now,
                           body=BODY, key_id=key_id_of(ROOT.key.verify_key),
                           statement=statement, format_version=3)
    error = await refusal(store_for(FakeUpstream(encode_file(header, BODY, ROOT.key))))
    assert error.reason == "invalid" and "format_version 3 is newer" in str(error)


async def test_an_https_upstream_is_verified_with_the_configured_ca_file(
    tmp_path: Path
) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    upstream = HostileUpstream(ROOT.sign(3, 3), ssl_context=server)
    trusted = [format_verify_key(ROOT.key.verify_key)]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(upstream.serve)
            trusting = FollowerStore(ControlPlaneConfig(url=upstream.url, trusted_keys=trusted,
                                                        ca_file=str(ca_file)),
                                     max_schema_version=1)
            pointer = await trusting.observe()
            assert pointer is not None and pointer.revision == 3
            await trusting.aclose()
            # Without it the system's trust store is used, which knows nothing of this CA.
            untrusting = FollowerStore(ControlPlaneConfig(url=upstream.url, trusted_keys=trusted),
                                       max_schema_version=1)
            error: BaseException | None = await refusal(untrusting)
            assert isinstance(error, ControlPlaneError) and error.reason == "unavailable"
            while error is not None and not isinstance(error, ssl.SSLCertVerificationError):
                error = error.__cause__ or error.__context__
            assert error is not None
            await untrusting.aclose()
            nursery.cancel_scope.cancel()


async def test_a_certificate_from_an_untrusted_ca_is_named_in_the_error(
    tmp_path: Path
) -> None:
    # httpx's ConnectError says nothing (its text is empty): the refusal is its innermost
    # cause, the ssl.SSLCertVerificationError, which the error must name.
    trustme = pytest.importorskip("trustme")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(server)
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))  # not the CA that signed it
    upstream = HostileUpstream(ROOT.sign(3, 3), ssl_context=server)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(upstream.serve)
            store = FollowerStore(ControlPlaneConfig(
                url=upstream.url, trusted_keys=[format_verify_key(ROOT.key.verify_key)],
                ca_file=str(other_ca)), max_schema_version=1)
            error = await refusal(store)
            await store.aclose()
            nursery.cancel_scope.cancel()
    assert error.reason == "unavailable" and len(str(error)) <= 500
    assert str(error).startswith(f"upstream {upstream.url}/v1/revision unreachable: ")
    assert "CERTIFICATE_VERIFY_FAILED" in str(error), str(error)
    assert "unable to get local issuer certificate" in str(error)
    assert "[control_plane].ca_file" in str(error)


def test_an_accepted_file_is_read_at_most_4_kib(tmp_path: Path) -> None:
    path = tmp_path / "lkg.bin.accepted"
    AcceptedStatements(str(path)).accept(statement_of(ROOT.sign(2, 2)))
    record = path.read_bytes().strip()
    path.write_bytes(b" " * (4096 - len(record)) + record)  # padded: JSON allows blanks
    assert AcceptedStatements(str(path)).highest is not None
    path.write_bytes(b" " * (4097 - len(record)) + record)  # its last byte past the bound
    with pytest.raises(ConfigError) as info:
        AcceptedStatements(str(path))
    assert "is not an accepted statement" in str(info.value)


def test_an_unreadable_accepted_file_refuses_to_start_naming_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "lkg.bin.accepted"  # under a regular file: ENOTDIR
    with pytest.raises(ConfigError) as info:
        AcceptedStatements(str(path))
    assert info.value.path == "$.cache.path"
    assert str(info.value).endswith(f"{path} cannot be read: Not a directory")


def test_a_reset_record_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "lkg.bin.accepted"
    write_reset(str(path))
    assert path.stat().st_mode & 0o777 == 0o600


def test_sync_rereads_only_a_file_changed_by_someone_else(tmp_path: Path) -> None:
    path = str(tmp_path / "lkg.bin.accepted")
    assert AcceptedStatements(None).sync() is False
    accepted = AcceptedStatements(path)
    assert accepted.durable
    statement = statement_of(ROOT.sign(2, 2)).without_bytes()
    accepted.accept(statement)
    inode = os.stat(path).st_ino
    # Its own write is no change, nor is the file as read at start: not read, not rewritten.
    assert accepted.sync() is False and os.stat(path).st_ino == inode
    restarted = AcceptedStatements(path)
    assert restarted.durable and restarted.sync() is False and os.stat(path).st_ino == inode
    # A reset written meanwhile is taken; the next accept ends it.
    write_reset(path)
    assert accepted.sync() is True and accepted.highest is None and accepted.reset
    accepted.accept(statement)
    assert not accepted.reset and AcceptedStatements(path).highest == statement
    # A statement written by another after a reset ends the reset too.
    write_reset(path)
    assert accepted.sync() is True and accepted.reset
    AcceptedStatements(path).accept(statement)
    assert accepted.sync() is True and not accepted.reset and accepted.highest == statement


def test_sync_writes_again_a_removed_or_garbled_file_from_memory(tmp_path: Path) -> None:
    path = tmp_path / "lkg.bin.accepted"
    accepted = AcceptedStatements(str(path))
    statement = statement_of(ROOT.sign(3, 3)).without_bytes()
    accepted.accept(statement)
    path.unlink()
    assert accepted.sync() is False and AcceptedStatements(str(path)).highest == statement
    path.write_bytes(b"{garbled")
    assert accepted.sync() is False and accepted.durable
    assert AcceptedStatements(str(path)).highest == statement


def test_a_reset_taken_by_sync_after_a_failed_write_is_durable(tmp_path: Path) -> None:
    from supervisor.sinks.lkg import CacheUnwritable

    path = tmp_path / "gone" / "lkg.bin.accepted"
    accepted = AcceptedStatements(str(path))
    with pytest.raises(CacheUnwritable):
        accepted.accept(statement_of(ROOT.sign(2, 2)))
    (tmp_path / "gone").mkdir()
    write_reset(str(path))
    assert accepted.sync() is True and accepted.durable and accepted.highest is None


def test_an_accepted_file_with_a_time_out_of_range_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "lkg.bin.accepted"
    AcceptedStatements(str(path)).accept(statement_of(ROOT.sign(2, 2)))
    record = json.loads(path.read_text())
    record["issued_at"] = "1999-12-31T00:00:00Z"
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError) as info:
        AcceptedStatements(str(path))
    assert "is not an accepted statement" in str(info.value) and "1999" in str(info.value)
