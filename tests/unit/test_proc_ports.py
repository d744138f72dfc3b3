"""tests.proc.free_port: a port nothing listens on, from this worker's block below the
ephemeral range."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import proc


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_port_something_listens_on_is_passed_over(
        monkeypatch: pytest.MonkeyPatch, listening: int) -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        free = int(spare.getsockname()[1])
    monkeypatch.setattr(proc, "_next_port", iter([listening, free]))
    assert proc.free_port() == free


def test_a_block_with_no_port_free_is_an_error_not_an_endless_search(
        monkeypatch: pytest.MonkeyPatch, listening: int) -> None:
    # Every port of the worker's block taken (servers of earlier tests still up, or the
    # block shared with another run): one pass over it, then a clear failure.
    monkeypatch.setattr(proc, "_next_port", itertools.cycle([listening]))
    with pytest.raises(AssertionError, match="no free port"):
        proc.free_port()


def test_the_blocks_lie_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert proc._PORTS_FROM + proc._BLOCKS * proc._BLOCK <= low
