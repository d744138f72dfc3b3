"""GET /v1/revision: the active revision as the signed cache file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from supervisor.admin.app import AdminApp
from supervisor.admin.signed import SignedRevisionFile
from tests.adminserver import call, make_ctx
from tests.fakes.snapshot import FakeSnapshot
from tests.signedrevision import BODY, signed

DIGEST = hashlib.sha256(BODY).digest()


def ctx_with_cache(tmp_path: Path, *, signing: bool = True, upstream: str | None = None):  # type: ignore[no-untyped-def]
    ctx = make_ctx()
    ctx.signed = SignedRevisionFile(str(tmp_path / "lkg.bin"), signing)
    ctx.upstream = upstream
    return ctx


async def test_503_without_signing_key_or_before_a_revision(tmp_path: Path) -> None:
    status, _, body = await call(AdminApp(make_ctx()), "GET", "/v1/revision")
    assert status == 503
    ctx = ctx_with_cache(tmp_path, signing=False)
    ctx.state.swap(FakeSnapshot(7, 1), body_sha256=DIGEST)  # type: ignore[arg-type]
    status, _, body = await call(AdminApp(ctx), "GET", "/v1/revision")
    assert status == 503 and msgspec.json.decode(body)["error"] == "no_signing_key"
    ctx = ctx_with_cache(tmp_path)
    status, _, body = await call(AdminApp(ctx), "GET", "/v1/revision")
    assert status == 503 and msgspec.json.decode(body)["error"] == "no_snapshot"


async def test_serves_the_cache_bytes_of_the_active_revision_with_etag_and_304(
    tmp_path: Path
) -> None:
    ctx = ctx_with_cache(tmp_path)
    app = AdminApp(ctx)
    ctx.state.swap(FakeSnapshot(7, 1), body_sha256=DIGEST)  # type: ignore[arg-type]
    # Not exported yet: 503, retry soon.
    status, headers, _ = await call(app, "GET", "/v1/revision")
    assert status == 503 and headers[b"retry-after"] == b"1"
    (tmp_path / "lkg.bin").write_bytes(signed(6))  # an older revision: not served as 7
    status, _, _ = await call(app, "GET", "/v1/revision")
    assert status == 503
    data = signed(7)
    (tmp_path / "lkg.bin").write_bytes(data)
    status, headers, body = await call(app, "GET", "/v1/revision")
    assert status == 200 and body == data and headers[b"etag"] == b'"7"'
    # Held in memory: a second answer needs no file.
    (tmp_path / "lkg.bin").unlink()
    status, _, body = await call(app, "GET", "/v1/revision")
    assert status == 200 and body == data
    status, headers, body = await call(app, "GET", "/v1/revision",
                                       [(b"if-none-match", b'"7"')])
    assert status == 304 and body == b"" and headers[b"etag"] == b'"7"'


async def test_status_names_the_upstream_as_source(tmp_path: Path) -> None:
    ctx = ctx_with_cache(tmp_path, upstream="http://hub:9464")
    ctx.revision.published(3, 1, "control_plane", 0.01)
    report = msgspec.json.decode((await call(AdminApp(ctx), "GET", "/status"))[2])
    assert report["revision"]["source"] == "http://hub:9464"
    assert report["revision"]["upstream"] == "http://hub:9464"
