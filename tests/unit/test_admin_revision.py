"""GET /v1/revision: the active revision's signed statement, as the cache file holds it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

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
