"""The signed cache: what the mutation run found unasserted.

The served mark's text and its bounds, a mark that is only rewritten when it
changes, the age, discarding, and the key texts. Against real files in a
temporary directory and the cache's own file seam.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from supervisor.sinks.lkg import CacheError, CacheUnwritable, LastKnownGood, generate_signing_key
from tests.unit.test_lkg_safety import Recording, export, make, mark_of

BODY = b'{"schema_version": 1, "aliases": {}}'


@pytest.fixture
def signer(tmp_path: Path) -> tuple[str, str]:
    keys = tmp_path / "keys"
    keys.mkdir()
    path = str(keys / "signing.key")
    return path, generate_signing_key(path)


@pytest.fixture
def cache_path(tmp_path: Path) -> str:
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    return str(directory / "lkg.bin")


# -- the mark's text -------------------------------------------------------------------


@pytest.mark.parametrize("text", ["7", "7\n", "  7 \n", "00000000000000000007"])
def test_a_mark_equal_to_the_cache_in_any_spelling_loads(
    cache_path: str, signer: tuple[str, str], text: str,
) -> None:
    export(make(cache_path, signer), 7)
    Path(cache_path + ".served").write_text(text)
    loaded = make(cache_path, signer).load()
    assert loaded is not None and loaded.revision == 7


@pytest.mark.parametrize("text", ["000000000000000000007", "7x", "-7", "", "\n"])
def test_a_mark_that_is_not_a_revision_id_refuses_the_cache(
    cache_path: str, signer: tuple[str, str], text: str,
) -> None:
    export(make(cache_path, signer), 7)
    Path(cache_path + ".served").write_text(text)
    with pytest.raises(CacheError) as info:
        make(cache_path, signer).load()
    if text.strip():
        assert info.value.reason == "corrupt"
        assert info.value.path == cache_path + ".served"
    else:  # empty: as good as no mark, which is never trusted
        assert info.value.reason in ("corrupt", "rollback")


def test_a_mark_above_the_cache_refuses_it_naming_the_cache(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 7)
    Path(cache_path + ".served").write_text("8\n")
    with pytest.raises(CacheError) as info:
        make(cache_path, signer).load()
    assert info.value.reason == "rollback"
    assert info.value.path == cache_path
    assert info.value.revision == 7
    assert "older than revision 8" in info.value.detail


def test_a_mark_of_zero_next_to_a_cache_is_refused_naming_the_mark(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 7)
    Path(cache_path + ".served").write_text("0\n")
    with pytest.raises(CacheError) as info:
        make(cache_path, signer).load()
    assert info.value.reason == "rollback"
    assert info.value.path == cache_path + ".served"
    assert "mark is 0 next to a cache of revision 7" in info.value.detail
    Path(cache_path + ".served").unlink()
    with pytest.raises(CacheError) as info:
        make(cache_path, signer).load()
    assert "mark is missing next to a cache of revision 7" in info.value.detail


# -- the mark is written only when it changes, and only upwards by note_served ------------


def test_the_mark_is_rewritten_only_when_it_changes(
    cache_path: str, signer: tuple[str, str],
) -> None:
    files = Recording()
    cache = make(cache_path, signer, files)
    export(cache, 5)
    export(cache, 5)
    cache.note_served(5)
    cache.note_served(3)
    served = cache_path + ".served"
    assert files.written.count(served) == 1
    assert files.written.count(cache_path) == 2
    cache.note_served(6)
    assert files.written.count(served) == 2
    assert mark_of(cache_path) == "6\n"


def test_a_restarted_replica_rewrites_an_equal_mark_not_at_all(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 5)
    files = Recording()
    restarted = make(cache_path, signer, files)
    restarted.note_served(5)
    assert files.written == []
    restarted.note_served(4)  # never lowers what the earlier run served
    assert files.written == []
    assert mark_of(cache_path) == "5\n"


def test_a_failed_mark_write_is_retried_by_the_next_note(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 5)
    files = Recording(stop_after=0, fail=OSError(28, "No space left on device"))
    cache = make(cache_path, signer, files)
    with pytest.raises(CacheUnwritable) as info:
        cache.note_served(8)
    assert info.value.path == cache_path + ".served"
    assert mark_of(cache_path) == "5\n"
    files.stop_after = None  # the disk has room again
    cache.note_served(6)  # below what is noted in memory: the mark goes to 8
    assert mark_of(cache_path) == "8\n"


def test_a_garbled_mark_is_rewritten_by_the_next_export(
    cache_path: str, signer: tuple[str, str],
) -> None:
    export(make(cache_path, signer), 5)
    Path(cache_path + ".served").write_text("garbage")
    cache = make(cache_path, signer)
    export(cache, 5)
    assert mark_of(cache_path) == "5\n"
    loaded = make(cache_path, signer).load()
    assert loaded is not None and loaded.revision == 5


@pytest.mark.parametrize("revision", [0, -1])
def test_note_served_refuses_what_is_not_a_revision(
    cache_path: str, signer: tuple[str, str], revision: int,
) -> None:
    cache = make(cache_path, signer)
    with pytest.raises(ValueError, match="revision must be >= 1"):
        cache.note_served(revision)
    assert mark_of(cache_path) is None


# -- discard ----------------------------------------------------------------------------------


def test_discard_if_newer_at_the_boundaries(cache_path: str, signer: tuple[str, str]) -> None:
    cache = make(cache_path, signer)
    assert cache.discard_if_newer(0) is False  # nothing there
    export(cache, 5)
    assert cache.discard_if_newer(5) is False
    assert os.path.exists(cache_path)
    assert cache.discard_if_newer(4) is True
    assert not os.path.exists(cache_path)
    with pytest.raises(ValueError, match="revision must be >= 0"):
        cache.discard_if_newer(-1)


# -- age ---------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_age_counts_from_the_export_and_is_never_negative(
    cache_path: str, signer: tuple[str, str],
) -> None:
    clock = Clock()
    cache = LastKnownGood(cache_path, signing_key_path=signer[0], trusted_keys=[signer[1]],
                          max_schema_version=1, clock=clock)
    export(cache, 3)
    loaded = cache.load()
    assert loaded is not None and loaded.age_s == 0.0
    clock.now += timedelta(seconds=90)
    assert loaded.age_s == 90.0
    clock.now -= timedelta(hours=1)  # the clock was set back
    assert loaded.age_s == 0.0
    assert loaded.created_at == datetime(2026, 1, 1, tzinfo=UTC)
