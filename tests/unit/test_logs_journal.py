"""``[log].format = "journal"``: JSON lines behind syslog priority prefixes, and ``auto``."""

from __future__ import annotations

import io
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor import logs

LINE = re.compile(r"^<(\d)>(\{.*\})$")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    logs.configure("warning", "console", io.StringIO())


def parse(text: str) -> list[tuple[int, dict[str, object]]]:
    out = []
    for raw in text.splitlines():
        match = LINE.match(raw)
        assert match, f"not a journal line: {raw!r}"
        out.append((int(match.group(1)), json.loads(match.group(2))))
    return out


def test_each_level_gets_its_syslog_priority() -> None:
    stream = io.StringIO()
    logs.configure("debug", "journal", stream)
    log = logs.get_logger("t")
    log.debug("d")
    log.info("i", revision=7)
    log.warning("w")
    log.error("e", reason="secret")
    log.critical("refused to boot", reason="secret")
    lines = parse(stream.getvalue())
    assert [(p, d["event"]) for p, d in lines] == [
        (7, "d"), (6, "i"), (4, "w"), (3, "e"), (2, "refused to boot")]
    assert lines[1][1]["revision"] == 7 and lines[1][1]["level"] == "info"
    assert "timestamp" in lines[0][1]


def test_foreign_stdlib_lines_get_a_priority_too() -> None:
    stream = io.StringIO()
    logs.configure("info", "journal", stream)
    logging.getLogger("httpx").error("boom")
    [(priority, doc)] = parse(stream.getvalue())
    assert priority == 3 and doc["event"] == "boom"


def test_auto_picks_journal_only_when_journal_stream_names_the_stream(tmp_path: Path) -> None:
    with open(tmp_path / "err", "w") as stream, open(tmp_path / "other", "w") as other:
        st = os.fstat(stream.fileno())
        named = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logs.resolve_format("auto", stream, named) == "journal"
        ot = os.fstat(other.fileno())
        elsewhere = {"JOURNAL_STREAM": f"{ot.st_dev}:{ot.st_ino}"}
        assert logs.resolve_format("auto", stream, elsewhere) == "json"
        assert logs.resolve_format("auto", stream, {}) == "json"
        assert logs.resolve_format("auto", stream, {"JOURNAL_STREAM": "garbage"}) == "json"
        assert logs.resolve_format("json", stream, named) == "json"
    assert logs.resolve_format("auto", io.StringIO(), named) == "json"
