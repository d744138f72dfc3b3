"""``[log].format = "journal"``: JSON lines behind syslog priority prefixes, and ``auto``."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from supervisor import logs
from tests.journald import Journal

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


async def test_native_journal_protocol_every_key_a_field_newlines_length_prefixed(
        tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sock")
    await journal.bind()
    stream = io.StringIO()
    try:
        logs.configure("info", "journal", stream, journal_socket=str(journal.path))
        log = logs.get_logger("t")
        log.error("refused to boot", reason="secret", revision=7, keys=["a"], flag=True,
                  detail="line one\nline two", **{"odd-key": "x", "_trusted": "y"})
        log.debug("dropped below the level")
        logging.getLogger("httpx").warning("boom")
        with trio.fail_after(5):
            entry = await journal.receive()
            foreign = await journal.receive()
    finally:
        journal.close()
    assert stream.getvalue() == ""  # the journal took both lines
    assert entry["MESSAGE"].startswith(b'{"') and json.loads(entry["MESSAGE"])["reason"] == "secret"
    assert entry["PRIORITY"] == b"3" and entry["SYSLOG_IDENTIFIER"] == b"trio-supervisor"
    assert entry["REASON"] == b"secret" and entry["REVISION"] == b"7"
    assert entry["EVENT"] == b"refused to boot" and entry["COMPONENT"] == b"t"
    assert entry["KEYS"] == b'["a"]' and entry["FLAG"] == b"true"
    assert entry["DETAIL"] == b"line one\nline two"
    assert entry["ODD_KEY"] == b"x" and entry["TRUSTED"] == b"y"  # no client sets _FIELDS
    assert b"T" in entry["TIMESTAMP"] and entry["LEVEL"] == b"error"
    assert foreign["PRIORITY"] == b"4" and foreign["EVENT"] == b"boom"


async def test_an_entry_too_large_for_a_datagram_reaches_the_journal_through_a_memfd(
        tmp_path: Path) -> None:
    # Larger than a datagram may be (the socket's send buffer): sent as journald's own
    # client does, the payload in a sealed memfd passed over the socket.
    journal = Journal(tmp_path / "journal.sock")
    await journal.bind()
    stream = io.StringIO()
    detail = "x" * 400_000
    try:
        logs.configure("info", "journal", stream, journal_socket=str(journal.path))
        logs.get_logger("t").error("revision refused", detail=detail)
        with trio.fail_after(5):
            entry = await journal.receive()
    finally:
        journal.close()
    assert stream.getvalue() == ""
    assert entry["DETAIL"] == detail.encode() and entry["PRIORITY"] == b"3"
    assert json.loads(entry["MESSAGE"])["detail"] == detail


def test_without_a_journal_socket_lines_keep_their_priority_prefix(tmp_path: Path) -> None:
    stream = io.StringIO()
    logs.configure("info", "journal", stream, journal_socket=str(tmp_path / "none.sock"))
    logs.get_logger("t").warning("w", reason="stale")
    [(priority, doc)] = parse(stream.getvalue())
    assert priority == 4 and doc["reason"] == "stale"


def test_an_entry_too_large_goes_to_stderr_whole_when_no_memfd_can_be_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journal_sock.bind(str(tmp_path / "journal.sock"))

    def no_memfd(name: str, flags: int = 0) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    stream = io.StringIO()
    detail = "x" * 400_000
    try:
        logs.configure("info", "journal", stream, journal_socket=str(tmp_path / "journal.sock"))
        logs.get_logger("t").error("revision refused", detail=detail)
    finally:
        journal_sock.close()
    [(priority, doc)] = parse(stream.getvalue())
    assert priority == 3 and doc["detail"] == detail


async def test_large_entries_leave_no_descriptor_open_and_a_vanished_socket_falls_back(
        tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sock")
    await journal.bind()
    stream = io.StringIO()
    logs.configure("info", "journal", stream, journal_socket=str(journal.path))
    log = logs.get_logger("t")
    open_fds = len(os.listdir("/proc/self/fd"))
    try:
        with trio.fail_after(10):
            for n in range(100):
                log.error("revision refused", detail="x" * 300_000, n=n)
                assert (await journal.receive())["N"] == str(n).encode()
        assert len(os.listdir("/proc/self/fd")) == open_fds
    finally:
        journal.close()
    journal.path.unlink()  # journald gone between two lines (restarted, or stopped)
    log.error("small", n=1)
    log.error("large", detail="y" * 300_000)
    assert [doc["event"] for _, doc in parse(stream.getvalue())] == ["small", "large"]
    assert len(os.listdir("/proc/self/fd")) == open_fds - 1  # the journal's own socket
