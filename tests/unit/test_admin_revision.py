"""GET /v1/revision: the active revision's signed statement, as the cache file holds it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from supervisor.admin import signed
from supervisor.admin.app import AdminApp
from supervisor.admin.signed import SignedRevisionFile
from tests.adminserver import call, make_ctx
from tests.fakes.snapshot import FakeSnapshot, restate, serve
from tests.fakes.statements import BODY, Root, statement_of

DIGEST = hashlib.sha256(BODY).digest()
ROOT = Root()
OTHER_BODY = BODY.replace(b"a.example", b"b.example")


def ctx_with_cache(tmp_path: Path, *, signing: bool = True, upstream: str | None = None):  # type: ignore[no-untyped-def]
    ctx = make_ctx()
    ctx.signed = SignedRevisionFile(str(tmp_path / "lkg.bin"), signing)
    ctx.state.upstream = upstream
    return ctx


async def test_503_without_signing_key_or_before_a_revision(tmp_path: Path) -> None:
    status, _, body = await call(AdminApp(make_ctx()), "GET", "/v1/revision")
    assert status == 503
    ctx = ctx_with_cache(tmp_path, signing=False)
    serve(ctx.state, FakeSnapshot(7, 1), body_sha256=DIGEST)
    status, _, body = await call(AdminApp(ctx), "GET", "/v1/revision")
    assert status == 503 and msgspec.json.decode(body)["error"] == "no_signing_key"
    ctx = ctx_with_cache(tmp_path)
    status, _, body = await call(AdminApp(ctx), "GET", "/v1/revision")
    assert status == 503 and msgspec.json.decode(body)["error"] == "no_snapshot"


async def test_serves_the_cache_bytes_of_the_active_statement_with_etag_and_304(
    tmp_path: Path
) -> None:
    ctx = ctx_with_cache(tmp_path)
    app = AdminApp(ctx)
    data = ROOT.sign(7, sequence=9)
    statement = statement_of(data)
    serve(ctx.state, FakeSnapshot(7, 1), body_sha256=DIGEST,
                   statement=statement)
    # Not exported yet: 503, retry soon.
    status, headers, _ = await call(app, "GET", "/v1/revision")
    assert status == 503 and headers[b"retry-after"] == b"1"
    (tmp_path / "lkg.bin").write_bytes(ROOT.sign(6, sequence=8))  # older: not served as 7
    status, _, _ = await call(app, "GET", "/v1/revision")
    assert status == 503
    (tmp_path / "lkg.bin").write_bytes(data)
    etag = statement.etag().encode()
    status, headers, body = await call(app, "GET", "/v1/revision")
    assert status == 200 and body == data and headers[b"etag"] == etag
    assert etag.startswith(b'"9.') and etag != b'"7"'
    # Held in memory: a second answer needs no file.
    (tmp_path / "lkg.bin").unlink()
    status, _, body = await call(app, "GET", "/v1/revision")
    assert status == 200 and body == data
    status, headers, body = await call(app, "GET", "/v1/revision", [(b"if-none-match", etag)])
    assert status == 304 and body == b"" and headers[b"etag"] == etag


async def test_a_reused_id_or_a_fresh_statement_is_never_a_304(tmp_path: Path) -> None:
    ctx = ctx_with_cache(tmp_path)
    app = AdminApp(ctx)
    first = ROOT.sign(3, sequence=3)
    (tmp_path / "lkg.bin").write_bytes(first)
    serve(ctx.state, FakeSnapshot(3, 1), body_sha256=DIGEST,
                   statement=statement_of(first))
    old_etag = (await call(app, "GET", "/v1/revision"))[1][b"etag"]
    # The root's file restored from a backup: id 3 again, another body, another identity.
    restored = Root(ROOT.key, identity="sqlite:9:9").sign(3, sequence=1, body=OTHER_BODY)
    (tmp_path / "lkg.bin").write_bytes(restored)
    serve(ctx.state, FakeSnapshot(3, 2), body_sha256=hashlib.sha256(OTHER_BODY).digest(),
                   statement=statement_of(restored))
    status, headers, body = await call(app, "GET", "/v1/revision",
                                       [(b"if-none-match", old_etag)])
    assert status == 200 and body == restored and headers[b"etag"] != old_etag
    # A refresh of the same revision (same sequence, later issued_at): new bytes, not held ones.
    refreshed = Root(ROOT.key, identity="sqlite:9:9").sign(3, sequence=1, body=OTHER_BODY)
    (tmp_path / "lkg.bin").write_bytes(refreshed)
    restate(ctx.state, statement_of(refreshed))
    status, _, body = await call(app, "GET", "/v1/revision")
    assert status == 200 and body == refreshed


async def test_status_names_the_upstream_as_source(tmp_path: Path) -> None:
    ctx = ctx_with_cache(tmp_path, upstream="http://hub:9464")
    serve(ctx.state, FakeSnapshot(3, 1), source="control_plane")
    report = msgspec.json.decode((await call(AdminApp(ctx), "GET", "/status"))[2])
    assert report["revision"]["source"] == "http://hub:9464"
    assert report["revision"]["upstream"] == "http://hub:9464"


_STATEMENT = statement_of(ROOT.sign(7, sequence=9))


def _if_none_match_pieces(etag: str) -> st.SearchStrategy[str]:
    sequence, digest, micros = etag[1:-1].split(".")
    return st.lists(st.sampled_from([
        etag, f"W/{etag}", f'"{sequence}.{digest}.{int(micros) + 1}"',
        f'"{sequence}.{digest}.{int(micros) - 1}"', f'"{sequence}.{digest}.-1"',
        f'"{sequence}.{digest}"', f'"{int(sequence) + 1}.{digest}.{micros}"', '"7.-"', "*", " *",
        "W/", '"', ",", ", ", " ", ".", "-", "9" * 25, "\x00", "\xff", "\u0669", digest]),
        max_size=12).map("".join)


@settings(max_examples=200, deadline=None)
@example('""' + _STATEMENT.etag()[1:])  # an empty tag, then a stray: no tag of this statement
@given(_if_none_match_pieces(_STATEMENT.etag()) | st.binary(max_size=200).map(
    lambda b: b.decode("latin-1")))
def test_any_if_none_match_is_a_304_only_for_this_statement_or_a_later_issue_of_it(
    header: str
) -> None:
    etag = _STATEMENT.etag()
    sequence, digest, micros = etag[1:-1].split(".")
    answer = signed.not_modified(header, etag, _STATEMENT)
    assert isinstance(answer, bool)
    tags = re.findall(r'"([^"]*)"', header)
    later = any(t.split(".")[:2] == [sequence, digest] and t.count(".") == 2
                and re.fullmatch(r"-?[0-9]{1,20}", t.split(".")[2]) is not None
                and int(t.split(".")[2]) >= int(micros) for t in tags)
    assert answer == (header.strip() == "*" or later)
    # Without a statement only this ETag (weak or strong) or "*" matches.
    assert signed.not_modified(header, '"7.-"', None) == (
        header.strip() == "*" or '7.-' in tags)
