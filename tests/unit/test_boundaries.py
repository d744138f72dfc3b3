"""The boundary table: every row names a test that exists; the bounds kit holds its promises."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor import bounds, threads
from tools.boundary_table import BOUNDARIES

REPO = Path(__file__).resolve().parents[2]


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body
                      if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
    return names


@pytest.mark.parametrize("row", BOUNDARIES, ids=lambda b: b.where)
def test_every_boundary_names_a_test_that_exists(row: object) -> None:
    path, _, name = row.test.partition("::")  # type: ignore[attr-defined]
    assert (REPO / path).is_file(), row
    assert name.split("[")[0] in _test_names(REPO / path), row


def test_boundaries_are_unique() -> None:
    wheres = [(b.where, b.enters) for b in BOUNDARIES]
    assert len(wheres) == len(set(wheres))


@given(st.text(), st.integers(min_value=40, max_value=4096))
def test_a_cut_text_fits_its_limit_and_names_the_full_length(text: str, limit: int) -> None:
    out = bounds.cut(text, limit)
    size = len(text.encode("utf-8", "surrogateescape"))
    assert len(out.encode("utf-8", "surrogateescape")) <= limit
    if size <= limit:
        assert out == text
    else:
        assert out.endswith(f"… ({size} bytes)")


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(min_value=-2, max_value=40))
def test_a_cut_text_fits_a_limit_smaller_than_its_own_marker(text: str, limit: int) -> None:
    out = bounds.cut(text, limit)
    shown = text.encode("utf-8", "backslashreplace")
    assert len(out.encode()) <= max(limit, 0)
    if len(shown) <= limit:
        assert out == shown.decode()
    elif limit >= len(f"… ({len(shown)} bytes)".encode()):
        assert out.endswith(f"… ({len(shown)} bytes)")
    elif limit >= len("…".encode()):
        # No room for the length: the mark alone still says the text was cut.
        assert out.endswith("…")
        assert shown.startswith(out.removesuffix("…").encode())
    else:
        assert out == ""


@given(st.text(st.characters(codec=None, categories=["Cs", "Mn", "Lu"])),
       st.integers(min_value=40, max_value=4096))
def test_a_cut_text_of_lone_surrogates_is_valid_utf8_that_shows_them(text: str,
                                                                     limit: int) -> None:
    # A lone surrogate (JSON's "\\ud800", a byte os.environ could not decode) has no
    # UTF-8: a detail keeping one could not be logged, stored or sent.
    out = bounds.cut(text, limit)
    shown = text.encode("utf-8", "backslashreplace")
    assert len(out.encode("utf-8")) <= limit
    assert out == shown.decode() if len(shown) <= limit else out.endswith(f"({len(shown)} bytes)")


def test_a_cut_text_shows_a_lone_surrogate_as_its_escape() -> None:
    assert bounds.cut("a\ud800b") == "a\\ud800b"
    assert bounds.cut("\udcff" * 2000, 100).endswith("… (12000 bytes)")


@given(st.text())
def test_a_quoted_name_is_one_printable_line(name: str) -> None:
    out = bounds.quoted(name)
    assert out.isprintable() and "\n" not in out
    assert len(out.encode()) <= bounds.NAME_BYTES


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(min_value=40, max_value=200))
def test_a_shown_name_is_as_written_when_plain_and_quoted_otherwise(name: str, limit: int) -> None:
    out = bounds.shown(name, limit)
    assert out.isprintable() and len(out.encode()) <= limit
    plain = name.isprintable() and len(name.encode("utf-8", "surrogatepass")) <= limit
    assert out == (name if plain else bounds.quoted(name, limit))


@given(st.binary(max_size=300_000), st.integers(min_value=0, max_value=200_000))
def test_a_capped_read_returns_all_or_refuses_past_the_limit(data: bytes, limit: int) -> None:
    import io

    stream = io.BytesIO(data)
    if len(data) <= limit:
        assert bounds.read_capped(stream.read, limit, "x") == data
    else:
        with pytest.raises(bounds.TooLarge) as caught:
            bounds.read_capped(stream.read, limit, "x")
        assert caught.value.limit == limit
        # Never read more than the limit and one byte.
        assert stream.tell() == limit + 1


def test_a_range_check_names_the_place_and_both_ends() -> None:
    assert bounds.check_range("$.x", 5, 0, 10) == 5
    with pytest.raises(bounds.OutOfRange, match=r"\$\.x: 11 is outside 0\.\.10"):
        bounds.check_range("$.x", 11, 0, 10)


@given(st.text(), st.integers(min_value=40, max_value=4096))
def test_a_text_read_as_its_head_and_length_is_cut_as_a_whole_one(text: str, limit: int) -> None:
    size = len(text.encode("utf-8", "surrogateescape"))
    assert bounds.cut_read(text[:limit], size, limit) == bounds.cut(text, limit)


def test_the_sequence_bound_is_written_once() -> None:
    # 2^62, the highest sequence a signed statement carries, has one owner
    # (bounds.MAX_SEQUENCE) that every reader imports, whatever its layer.
    assert bounds.MAX_SEQUENCE == 2**62
    spelled = []
    for path in sorted((REPO / "supervisor").rglob("*.py")):
        if path.name == "bounds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            written = ast.unparse(node).replace(" ", "") if isinstance(node, ast.BinOp) else ""
            if written in ("2**62", "1<<62") or (
                    isinstance(node, ast.Constant) and node.value == 2**62):
                spelled.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert spelled == []


def test_the_table_states_the_bounds_the_code_holds() -> None:
    said = " ".join(f"{b.size} {b.deadline}" for b in BOUNDARIES)
    stated = re.findall(r"(\d+)(?: bytes)? \((NAME_BYTES|PATH_BYTES)\)", said)
    assert {name for _, name in stated} == {"NAME_BYTES", "PATH_BYTES"}
    for number, name in stated:
        assert int(number) == getattr(bounds, name), (number, name)
    assert f"FILE_IO_DEADLINE_S ({threads.FILE_IO_DEADLINE_S:g} s)" in said


def test_a_size_check_passes_the_bound_and_refuses_one_past_it() -> None:
    assert bounds.check_size("body", 10, 10) == 10
    with pytest.raises(bounds.TooLarge) as caught:
        bounds.check_size("body", 11, 10)
    assert (caught.value.what, caught.value.limit, caught.value.size) == ("body", 10, 11)
    assert str(caught.value) == "body: more than 10 bytes"


def test_a_range_refusal_keeps_what_was_refused_and_the_range() -> None:
    with pytest.raises(bounds.OutOfRange) as caught:
        bounds.check_range("$.n", -1, 0, 5)
    assert (caught.value.what, caught.value.value, caught.value.low, caught.value.high) == (
        "$.n", -1, 0, 5)
