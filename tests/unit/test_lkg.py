"""The signed last-known-good cache: round trip, every refusal and its label, keys, keygen."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import nacl.signing
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.errors import ConfigError, SupervisorError
from supervisor.sinks.atomic import write_atomic
from supervisor.sinks.lkg import (
    FIRST_FORMAT_VERSION,
    FORMAT_VERSION,
    MAGIC,
    CacheError,
    CacheSkew,
    CacheUnwritable,
    KeyFileError,
    KeyFileExists,
    LastKnownGood,
    encode_file,
    encode_header,
    format_verify_key,
    generate_signing_key,
    key_id_of,
    parse_verify_key,
)

BODY = b'{"schema_version": 1, "aliases": {"chat": {"upstream": "https://llm.internal/v1"}}}'
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
HEADER_START = len(MAGIC) + 4


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Keys:
    """Key files written by keygen, and their verify-key texts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def make(self, name: str) -> tuple[str, str]:
        path = str(self.directory / f"{name}.key")
        return path, generate_signing_key(path)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    directory = tmp_path / "keys"
    directory.mkdir()
    return Keys(directory)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache_path(tmp_path: Path) -> str:
    return str(tmp_path / "lkg.bin")


@pytest.fixture
def signer(keys: Keys) -> tuple[str, str]:
    return keys.make("primary")


@pytest.fixture
def cache(cache_path: str, signer: tuple[str, str], clock: Clock) -> LastKnownGood:
    key_path, verify_text = signer
    return LastKnownGood(
        cache_path,
        signing_key_path=key_path,
        trusted_keys=[verify_text],
        max_schema_version=1,
        clock=clock,
    )


def _export(cache: LastKnownGood, revision: int = 7, **kw: Any) -> None:
    args: dict[str, Any] = {"generation": 3, "schema_version": 1, "body": BODY}
    args.update(kw)
    cache.export(revision=revision, **args)


def _refusal(cache: LastKnownGood) -> CacheError:
    with pytest.raises(CacheError) as info:
        cache.load()
    return info.value


def _signing_key(path: str) -> nacl.signing.SigningKey:
    text = Path(path).read_text().strip()
    return nacl.signing.SigningKey(base64.b64decode(text.split(":", 1)[1]))


def _craft(path: str, key_path: str, header: dict[str, Any], body: bytes = BODY) -> None:
    """Write a validly signed file with an arbitrary header object."""
    data = encode_file(msgspec.json.encode(header), body, _signing_key(key_path))
    Path(path).write_bytes(data)


def _v1_header(key_path: str, **overrides: Any) -> dict[str, Any]:
    header: dict[str, Any] = msgspec.json.decode(
        encode_header(
            revision=7,
            generation=3,
            schema_version=1,
            created_at=T0,
            body=BODY,
            key_id=key_id_of(_signing_key(key_path).verify_key),
        )
    )
    header.update(overrides)
    return header


def _primary_verify_key(cache_path: str) -> nacl.signing.VerifyKey:
    key_path = os.path.join(os.path.dirname(cache_path), "keys", "primary.key")
    return _signing_key(key_path).verify_key


def _flip(path: str, offset: int) -> None:
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 0x01
    Path(path).write_bytes(bytes(data))


def _header_len(path: str) -> int:
    return int.from_bytes(Path(path).read_bytes()[len(MAGIC) : HEADER_START], "big")


# --------------------------------------------------------------------------- round trip


def test_no_file_is_no_cache(cache: LastKnownGood) -> None:
    assert cache.load() is None


def test_round_trip(cache: LastKnownGood, cache_path: str, signer: tuple[str, str]) -> None:
    _export(cache, revision=7)
    loaded = cache.load()
    assert loaded is not None
    assert (loaded.revision, loaded.generation, loaded.schema_version) == (7, 3, 1)
    assert loaded.body == BODY
    assert loaded.created_at == T0
    assert loaded.created_at.tzinfo is not None
    assert loaded.key_id == parse_verify_key(signer[1])[0]
    assert stat.S_IMODE(os.stat(cache_path).st_mode) == 0o600
    assert Path(cache_path + ".served").read_text() == "7\n"
    assert stat.S_IMODE(os.stat(cache_path + ".served").st_mode) == 0o600
    assert sorted(os.listdir(os.path.dirname(cache_path))) == ["keys", "lkg.bin", "lkg.bin.served"]
    # A fresh instance (the next boot) reads the same.
    again = LastKnownGood(
        cache_path, signing_key_path=None, trusted_keys=[signer[1]], max_schema_version=1
    )
    reloaded = again.load()
    assert reloaded is not None
    assert (reloaded.revision, reloaded.body, reloaded.key_id) == (7, BODY, loaded.key_id)


def test_file_layout_matches_the_documented_format(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache)
    data = Path(cache_path).read_bytes()
    assert data.startswith(MAGIC)
    n = _header_len(cache_path)
    header = msgspec.json.decode(data[HEADER_START : HEADER_START + n])
    assert list(header) == [
        "format_version",
        "revision",
        "generation",
        "schema_version",
        "created_at",
        "body_length",
        "body_sha256",
        "key_id",
    ]
    # Without a statement (a store that reads no sequence) the file stays version 1.
    assert header["format_version"] == FIRST_FORMAT_VERSION == 1
    assert header["created_at"] == "2025-03-01T12:00:00Z"
    assert header["body_length"] == len(BODY)
    assert header["body_sha256"] == hashlib.sha256(BODY).hexdigest()
    assert data[HEADER_START + n + 64 :] == BODY
    signature = data[HEADER_START + n : HEADER_START + n + 64]
    _, verify = parse_verify_key(format_verify_key(_primary_verify_key(cache_path)))
    verify.verify(data[: HEADER_START + n], signature)


def test_export_overwrites_and_empty_body(cache: LastKnownGood) -> None:
    _export(cache, revision=7)
    _export(cache, revision=8, body=b"")
    loaded = cache.load()
    assert loaded is not None
    assert (loaded.revision, loaded.body) == (8, b"")


def test_age_is_reported_not_enforced(cache: LastKnownGood, clock: Clock) -> None:
    _export(cache)
    clock.now = T0 + timedelta(days=400, seconds=1.5)
    loaded = cache.load()
    assert loaded is not None  # a year-old cache still loads: outages are when it matters
    assert loaded.age_s == pytest.approx(400 * 86400 + 1.5)
    clock.now = T0 - timedelta(seconds=30)  # the clock went backwards
    assert loaded.age_s == 0.0


def test_naive_clock_is_taken_as_utc(cache_path: str, signer: tuple[str, str]) -> None:
    naive = LastKnownGood(
        cache_path,
        signing_key_path=signer[0],
        trusted_keys=[signer[1]],
        max_schema_version=1,
        clock=lambda: datetime(2025, 1, 2, 3, 4, 5),
    )
    _export(naive)
    loaded = naive.load()
    assert loaded is not None
    assert loaded.created_at == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


# --------------------------------------------------------------------------- tampering


def test_tampered_body_is_corrupt(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache)
    size = len(Path(cache_path).read_bytes())
    for offset in (size - len(BODY), size - len(BODY) // 2, size - 1):
        _export(cache)
        _flip(cache_path, offset)
        err = _refusal(cache)
        assert err.reason == "corrupt", offset
        assert "SHA-256" in err.detail
        assert err.revision == 7  # the signed header is authentic, so the id is known
        assert err.path == cache_path


def test_appended_body_is_corrupt(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache)
    with open(cache_path, "ab") as f:
        f.write(b" ")
    assert _refusal(cache).reason == "corrupt"


def test_every_altered_header_byte_is_denied(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache)
    original = Path(cache_path).read_bytes()
    n = _header_len(cache_path)
    for offset in range(HEADER_START, HEADER_START + n):
        Path(cache_path).write_bytes(original)
        _flip(cache_path, offset)
        err = _refusal(cache)
        assert err.reason == "denied", (offset, err)
        assert not isinstance(err, CacheSkew)


def test_altered_revision_in_header_is_denied(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache, revision=7)
    data = Path(cache_path).read_bytes()
    Path(cache_path).write_bytes(data.replace(b'"revision":7', b'"revision":9', 1))
    err = _refusal(cache)
    assert err.reason == "denied"
    assert err.revision is None  # nothing from an unauthenticated header is reported as fact


def test_altered_signature_is_denied(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache)
    sig_start = HEADER_START + _header_len(cache_path)
    original = Path(cache_path).read_bytes()
    for offset in (sig_start, sig_start + 31, sig_start + 63):
        Path(cache_path).write_bytes(original)
        _flip(cache_path, offset)
        assert _refusal(cache).reason == "denied"


def test_altered_magic_is_corrupt(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache)
    _flip(cache_path, 0)
    assert _refusal(cache).reason == "corrupt"


def test_altered_length_prefix_is_refused(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache)
    original = Path(cache_path).read_bytes()
    for offset in range(len(MAGIC), HEADER_START):
        for bit in range(8):
            data = bytearray(original)
            data[offset] ^= 1 << bit
            Path(cache_path).write_bytes(bytes(data))
            assert _refusal(cache).reason in ("corrupt", "denied")


def test_truncation_anywhere_is_corrupt(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache)
    original = Path(cache_path).read_bytes()
    n = _header_len(cache_path)
    regions = {
        "magic": range(len(MAGIC)),
        "length": range(len(MAGIC), HEADER_START),
        "header": range(HEADER_START, HEADER_START + n),
        "signature": range(HEADER_START + n, HEADER_START + n + 64),
        "body": range(HEADER_START + n + 64, len(original)),
    }
    for region, offsets in regions.items():
        assert len(offsets) > 0
        for cut in offsets:
            Path(cache_path).write_bytes(original[:cut])
            err = _refusal(cache)
            assert err.reason == "corrupt", (region, cut, err)


def test_garbage_file_is_corrupt(cache: LastKnownGood, cache_path: str) -> None:
    Path(cache_path).write_bytes(b'{"revision": 7}')
    err = _refusal(cache)
    assert err.reason == "corrupt"
    assert "magic" in err.detail


def test_unreadable_cache_is_corrupt(cache: LastKnownGood, cache_path: str) -> None:
    os.mkdir(cache_path)
    err = _refusal(cache)
    assert err.reason == "corrupt"
    assert "a directory" in err.detail


# --------------------------------------------------------------------------- keys and trust


def test_unknown_key_is_denied(cache_path: str, keys: Keys, clock: Clock) -> None:
    _, trusted_text = keys.make("trusted")
    rogue_path, _ = keys.make("rogue")
    rogue = LastKnownGood(
        cache_path,
        signing_key_path=rogue_path,
        trusted_keys=[trusted_text],
        max_schema_version=1,
        clock=clock,
    )
    assert rogue.signing_key_trusted is False
    _export(rogue)
    err = _refusal(rogue)
    assert err.reason == "denied"
    assert "not in cache.trusted_keys" in err.detail


def test_forged_key_id_is_denied(cache_path: str, keys: Keys) -> None:
    trusted_path, trusted_text = keys.make("trusted")
    rogue_path, _ = keys.make("rogue")
    # A rogue key signs a header that claims the trusted key's id.
    _craft(cache_path, rogue_path, _v1_header(trusted_path))
    reader = LastKnownGood(
        cache_path, signing_key_path=None, trusted_keys=[trusted_text], max_schema_version=1
    )
    assert _refusal(reader).reason == "denied"


def test_no_trusted_keys_denies_everything(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache)
    reader = LastKnownGood(cache_path, signing_key_path=None, trusted_keys=[], max_schema_version=1)
    assert _refusal(reader).reason == "denied"


def test_keyring_rotation(cache_path: str, keys: Keys, clock: Clock) -> None:
    _, old_text = keys.make("old")
    new_path, new_text = keys.make("new")
    ring = [old_text, new_text]
    writer = LastKnownGood(
        cache_path, signing_key_path=new_path, trusted_keys=ring, max_schema_version=1, clock=clock
    )
    assert writer.signing_key_trusted is True
    assert writer.trusted_key_ids == (parse_verify_key(old_text)[0], parse_verify_key(new_text)[0])
    _export(writer, revision=11)
    reader = LastKnownGood(
        cache_path, signing_key_path=None, trusted_keys=ring, max_schema_version=1
    )
    loaded = reader.load()
    assert loaded is not None
    assert loaded.revision == 11
    assert loaded.key_id == parse_verify_key(new_text)[0] == writer.signing_key_id
    # Dropping the old key afterwards changes nothing for files the new one signed.
    after = LastKnownGood(
        cache_path, signing_key_path=None, trusted_keys=[new_text], max_schema_version=1
    )
    assert after.load() is not None
    # Dropping the signer's key denies.
    before = LastKnownGood(
        cache_path, signing_key_path=None, trusted_keys=[old_text], max_schema_version=1
    )
    assert _refusal(before).reason == "denied"


def test_duplicate_trusted_keys_are_harmless(cache: LastKnownGood, signer: tuple[str, str]) -> None:
    reader = LastKnownGood(
        cache.path,
        signing_key_path=None,
        trusted_keys=[signer[1], "  " + signer[1] + "\n"],
        max_schema_version=1,
    )
    assert len(reader.trusted_key_ids) == 1


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "ed25519:",
        "ed25519:not base64!!",
        "ed25519:" + base64.b64encode(b"\x01" * 31).decode(),
        "ed25519:" + base64.b64encode(b"\x01" * 33).decode(),
        "rsa:" + base64.b64encode(b"\x01" * 32).decode(),
        base64.b64encode(b"\x01" * 32).decode(),
    ],
)
def test_bad_trusted_key_is_config_error_with_index(
    cache_path: str, signer: tuple[str, str], bad: str
) -> None:
    with pytest.raises(ConfigError) as info:
        LastKnownGood(
            cache_path,
            signing_key_path=None,
            trusted_keys=[signer[1], bad],
            max_schema_version=1,
        )
    assert info.value.path == "$.cache.trusted_keys[1]"
    with pytest.raises(ValueError):
        parse_verify_key(bad)


def test_secret_pasted_as_trusted_key_is_refused_without_echo(
    cache_path: str, signer: tuple[str, str]
) -> None:
    secret = Path(signer[0]).read_text().strip()
    with pytest.raises(ConfigError) as info:
        LastKnownGood(
            cache_path, signing_key_path=None, trusted_keys=[secret], max_schema_version=1
        )
    assert info.value.path == "$.cache.trusted_keys[0]"
    assert secret.split(":", 1)[1] not in str(info.value)


def test_signing_key_problems_are_config_errors(cache_path: str, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.key"
    garbage.write_bytes(b"\xff\xfe not a key")
    wrong = tmp_path / "wrong.key"
    wrong.write_text("ed25519-secret:" + base64.b64encode(b"k" * 16).decode() + "\n")
    for key_path in (str(tmp_path / "missing.key"), str(garbage), str(wrong), str(tmp_path)):
        with pytest.raises(ConfigError) as info:
            LastKnownGood(
                cache_path, signing_key_path=key_path, trusted_keys=[], max_schema_version=1
            )
        assert info.value.path == "$.cache.signing_key"


def test_untrusted_signing_key_is_exposed(cache_path: str, keys: Keys) -> None:
    signing_path, _ = keys.make("signer")
    _, other_text = keys.make("other")
    lkg = LastKnownGood(
        cache_path, signing_key_path=signing_path, trusted_keys=[other_text], max_schema_version=1
    )
    assert lkg.signing_key_trusted is False
    assert lkg.signing_key_id == key_id_of(_signing_key(signing_path).verify_key)


def test_export_without_signing_key_is_unwritable(cache_path: str, signer: tuple[str, str]) -> None:
    reader = LastKnownGood(
        cache_path, signing_key_path=None, trusted_keys=[signer[1]], max_schema_version=1
    )
    assert reader.signing_key_id is None
    with pytest.raises(CacheUnwritable) as info:
        _export(reader)
    assert info.value.reason == "unwritable"
    assert not os.path.exists(cache_path)


# --------------------------------------------------------------------------- versions


def test_schema_version_above_max_is_incompatible(cache: LastKnownGood) -> None:
    _export(cache, schema_version=2)
    err = _refusal(cache)
    assert err.reason == "incompatible"
    assert not isinstance(err, CacheSkew)
    assert err.revision == 7


def test_newer_format_version_is_skew(
    cache: LastKnownGood, cache_path: str, signer: tuple[str, str]
) -> None:
    _craft(cache_path, signer[0], _v1_header(signer[0], format_version=FORMAT_VERSION + 1))
    with pytest.raises(CacheSkew) as info:
        cache.load()
    assert info.value.reason == "incompatible"
    assert info.value.format_version == FORMAT_VERSION + 1
    assert isinstance(info.value, CacheError)


def test_newer_format_with_other_fields_is_still_skew(
    cache: LastKnownGood, cache_path: str, signer: tuple[str, str]
) -> None:
    key_id = key_id_of(_signing_key(signer[0]).verify_key)
    header = {"format_version": 9, "key_id": key_id, "chunks": [[0, 10]], "compression": "zstd"}
    _craft(cache_path, signer[0], header, body=b"\x28\xb5\x2f\xfd opaque")
    with pytest.raises(CacheSkew):
        cache.load()


def test_newer_format_signed_by_unknown_key_is_denied(
    cache: LastKnownGood, cache_path: str, keys: Keys
) -> None:
    rogue_path, _ = keys.make("rogue")
    _craft(cache_path, rogue_path, _v1_header(rogue_path, format_version=FORMAT_VERSION + 1))
    err = _refusal(cache)
    assert err.reason == "denied"
    assert not isinstance(err, CacheSkew)


@pytest.mark.parametrize(
    "overrides",
    [
        {"format_version": 0},
        {"revision": -1},
        {"revision": "7"},
        {"created_at": "2025-03-01T12:00:00"},  # no offset
        {"body_sha256": "ABC"},
        {"body_length": len(BODY) + 1},
        {"unexpected": True},
    ],
)
def test_authentic_but_malformed_header_is_corrupt(
    cache: LastKnownGood, cache_path: str, signer: tuple[str, str], overrides: dict[str, Any]
) -> None:
    _craft(cache_path, signer[0], _v1_header(signer[0], **overrides))
    assert _refusal(cache).reason == "corrupt"


def test_authentic_undecodable_header_is_corrupt(
    cache: LastKnownGood, cache_path: str, signer: tuple[str, str]
) -> None:
    Path(cache_path).write_bytes(encode_file(b"not json", BODY, _signing_key(signer[0])))
    err = _refusal(cache)
    assert err.reason == "corrupt"
    assert "authentic" in err.detail


# --------------------------------------------------------------------------- rollback


def test_rollback_after_note_served_higher(cache: LastKnownGood, cache_path: str) -> None:
    _export(cache, revision=5)
    cache.note_served(9)
    err = _refusal(cache)
    assert err.reason == "rollback"
    assert err.revision == 5
    assert Path(cache_path + ".served").read_text() == "9\n"


def test_rollback_mark_survives_restart(cache: LastKnownGood, signer: tuple[str, str]) -> None:
    _export(cache, revision=5)
    cache.note_served(6)
    fresh = LastKnownGood(
        cache.path, signing_key_path=None, trusted_keys=[signer[1]], max_schema_version=1
    )
    assert _refusal(fresh).reason == "rollback"


def test_old_file_restored_over_newer_export_is_rollback(
    cache: LastKnownGood, cache_path: str
) -> None:
    _export(cache, revision=5)
    old = Path(cache_path).read_bytes()  # e.g. a stale backup of the volume
    _export(cache, revision=6)
    Path(cache_path).write_bytes(old)
    assert _refusal(cache).reason == "rollback"


def test_note_served_never_lowers_the_mark(cache: LastKnownGood, cache_path: str) -> None:
    cache.note_served(9)
    cache.note_served(4)
    assert Path(cache_path + ".served").read_text() == "9\n"
    with pytest.raises(ValueError):
        cache.note_served(-1)


def test_equal_revision_is_not_rollback(cache: LastKnownGood) -> None:
    _export(cache, revision=5)
    cache.note_served(5)
    loaded = cache.load()
    assert loaded is not None
    assert loaded.revision == 5


def test_export_of_older_revision_resets_the_mark(cache: LastKnownGood, cache_path: str) -> None:
    # An operator pointed desired state back at an older revision id: the replica
    # serves it and exports it, and must be able to boot from that cache later.
    _export(cache, revision=9)
    cache.note_served(9)
    _export(cache, revision=5)
    assert Path(cache_path + ".served").read_text() == "5\n"
    loaded = cache.load()
    assert loaded is not None
    assert loaded.revision == 5


class _MarkUnwritable:
    """The cache's file seam with a mark that cannot be replaced (the disk is full)."""

    def write(self, path: str, data: bytes, *, mode: int) -> None:
        if path.endswith(".served"):
            raise OSError(28, "No space left on device")
        write_atomic(path, data, mode=mode)

    def remove(self, path: str) -> None:
        os.unlink(path)


def test_failed_lowering_export_keeps_the_old_cache(
    cache: LastKnownGood, cache_path: str, signer: tuple[str, str]
) -> None:
    _export(cache, revision=9)
    full = LastKnownGood(cache_path, signing_key_path=signer[0], trusted_keys=[signer[1]],
                         max_schema_version=1, files=_MarkUnwritable())
    with pytest.raises(CacheUnwritable) as info:
        _export(full, revision=5)
    assert info.value.path == cache_path + ".served"
    assert Path(cache_path + ".served").read_text() == "9\n"
    loaded = cache.load()
    assert loaded is not None
    assert loaded.revision == 9  # mark first, cache second: nothing was half-lowered


def test_garbled_mark_refuses_load_and_is_rewritten_by_note_served(
    cache: LastKnownGood, cache_path: str, signer: tuple[str, str]
) -> None:
    _export(cache, revision=5)
    Path(cache_path + ".served").write_text("lots\n")
    fresh = LastKnownGood(
        cache_path, signing_key_path=signer[0], trusted_keys=[signer[1]], max_schema_version=1
    )
    err = _refusal(fresh)
    assert err.reason == "corrupt"
    assert err.path == cache_path + ".served"
    fresh.note_served(5)
    assert Path(cache_path + ".served").read_text() == "5\n"
    assert fresh.load() is not None


def test_note_served_unwritable(cache: LastKnownGood, cache_path: str) -> None:
    os.mkdir(cache_path + ".served")
    with pytest.raises(CacheUnwritable) as info:
        cache.note_served(3)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.reason == "unwritable"


# --------------------------------------------------------------------------- export failures


def test_export_into_unwritable_directory(tmp_path: Path, signer: tuple[str, str]) -> None:
    blocker = tmp_path / "regular-file"
    blocker.write_bytes(b"")
    # A path under a regular file fails with ENOTDIR even for root.
    lkg = LastKnownGood(
        str(blocker / "lkg.bin"),
        signing_key_path=signer[0],
        trusted_keys=[signer[1]],
        max_schema_version=1,
    )
    with pytest.raises(CacheUnwritable) as info:
        _export(lkg)
    err = info.value
    assert err.reason == "unwritable"
    assert isinstance(err, CacheError)
    assert isinstance(err.__cause__, OSError)
    assert err.path == str(blocker / "lkg.bin.served")  # the first export writes the mark first
    assert sorted(os.listdir(tmp_path)) == ["keys", "regular-file"]


def test_failed_export_leaves_previous_cache(
    cache: LastKnownGood, cache_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _export(cache, revision=5)

    def no_space(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(CacheUnwritable):
        _export(cache, revision=6)
    monkeypatch.undo()
    loaded = cache.load()
    assert loaded is not None
    assert loaded.revision == 5
    assert sorted(os.listdir(os.path.dirname(cache_path))) == ["keys", "lkg.bin", "lkg.bin.served"]


# --------------------------------------------------------------------------- keygen


def test_keygen_writes_0600_and_prints_a_trusted_key(tmp_path: Path) -> None:
    out = tmp_path / "signing.key"
    old = os.umask(0)
    try:
        verify_text = generate_signing_key(str(out))
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert verify_text.startswith("ed25519:")
    assert " " not in verify_text  # the CLI prints it as the last word of a line
    key_id, verify = parse_verify_key(verify_text)
    assert verify == _signing_key(str(out)).verify_key
    assert len(key_id) == 16
    assert int(key_id, 16) >= 0
    assert key_id == hashlib.sha256(bytes(verify)).hexdigest()[:16]
    assert out.read_text().startswith("ed25519-secret:")
    lkg = LastKnownGood(
        str(tmp_path / "c"),
        signing_key_path=str(out),
        trusted_keys=[verify_text],
        max_schema_version=1,
    )
    assert lkg.signing_key_trusted is True


def test_keygen_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "signing.key"
    generate_signing_key(str(out))
    before = out.read_bytes()
    with pytest.raises(KeyFileExists) as info:
        generate_signing_key(str(out))
    assert isinstance(info.value, SupervisorError)
    assert not isinstance(info.value, CacheError)
    assert isinstance(info.value.__cause__, FileExistsError)
    assert info.value.path == str(out)
    assert out.read_bytes() == before


def test_keygen_refuses_a_dangling_symlink(tmp_path: Path) -> None:
    link = tmp_path / "link.key"
    link.symlink_to(tmp_path / "elsewhere.key")
    with pytest.raises(KeyFileExists):
        generate_signing_key(str(link))
    assert not (tmp_path / "elsewhere.key").exists()


def test_keygen_unwritable_location(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError) as info:
        generate_signing_key(str(tmp_path / "absent" / "k"))
    assert not isinstance(info.value, KeyFileExists)
    assert isinstance(info.value.__cause__, OSError)


def test_keygen_keys_differ(tmp_path: Path) -> None:
    assert generate_signing_key(str(tmp_path / "a")) != generate_signing_key(str(tmp_path / "b"))


def test_error_hierarchy() -> None:
    assert issubclass(CacheError, SupervisorError)
    assert issubclass(CacheSkew, CacheError)
    assert issubclass(CacheUnwritable, CacheError)
    assert issubclass(KeyFileExists, KeyFileError)
    assert issubclass(KeyFileError, SupervisorError)
    assert not issubclass(KeyFileError, CacheError)


# --------------------------------------------------------------------------- fuzzing

_FUZZ = settings(
    max_examples=int(os.environ.get("LKG_FUZZ_EXAMPLES", "300")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _only_cache_errors(cache: LastKnownGood, data: bytes) -> None:
    Path(cache.path).write_bytes(data)
    try:
        cache.load()
    except CacheError:
        return
    raise AssertionError("a mutated or arbitrary file loaded")


@_FUZZ
@given(data=st.binary(max_size=600))
def test_arbitrary_bytes_raise_only_cache_error(cache: LastKnownGood, data: bytes) -> None:
    _only_cache_errors(cache, data)


@_FUZZ
@given(
    length=st.integers(min_value=0, max_value=2**32 - 1),
    rest=st.binary(max_size=400),
)
def test_arbitrary_framed_bytes_raise_only_cache_error(
    cache: LastKnownGood, length: int, rest: bytes
) -> None:
    _only_cache_errors(cache, MAGIC + length.to_bytes(4, "big") + rest)


@_FUZZ
@given(
    header=st.dictionaries(
        st.sampled_from(["format_version", "key_id", "revision", "body_length", "x"]),
        st.one_of(st.integers(), st.text(max_size=20), st.none(), st.booleans()),
    ),
    rest=st.binary(max_size=100),
)
def test_arbitrary_headers_raise_only_cache_error(
    cache: LastKnownGood, header: dict[str, object], rest: bytes
) -> None:
    raw = msgspec.json.encode(header)
    _only_cache_errors(cache, MAGIC + len(raw).to_bytes(4, "big") + raw + rest)


_ORIGINAL: dict[str, bytes] = {}


def _valid_file(cache: LastKnownGood) -> bytes:
    if cache.path not in _ORIGINAL:
        _export(cache)
        _ORIGINAL[cache.path] = Path(cache.path).read_bytes()
    return _ORIGINAL[cache.path]


Mutation = Callable[[bytes], bytes]


@st.composite
def _mutations(draw: st.DrawFn) -> Mutation:
    kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
    position = draw(st.floats(min_value=0, max_value=1, exclude_max=True))
    value = draw(st.integers(min_value=1, max_value=255))

    def mutate(data: bytes) -> bytes:
        at = int(position * len(data))
        if kind == "flip":
            return data[:at] + bytes([data[at] ^ value]) + data[at + 1 :]
        if kind == "insert":
            return data[:at] + bytes([value]) + data[at:]
        if kind == "delete":
            return data[:at] + data[at + 1 :]
        return data[:at]

    return mutate


@_FUZZ
@given(mutation=_mutations())
def test_any_mutation_of_a_valid_file_is_refused(cache: LastKnownGood, mutation: Mutation) -> None:
    original = _valid_file(cache)
    mutated = mutation(original)
    assert mutated != original
    _only_cache_errors(cache, mutated)
