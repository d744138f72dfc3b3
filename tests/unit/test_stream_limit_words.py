"""The systemd unit and docs/operations.md say how many stream clients a descriptor limit allows;
the stream's client limit is derived from RLIMIT_NOFILE (no ``max_clients`` key), so
their figures are held to :func:`supervisor.admin.limits.derive`."""

from __future__ import annotations

import re
from pathlib import Path

from supervisor.admin.limits import derive

REPO = Path(__file__).resolve().parents[2]
UNIT = (REPO / "deploy" / "systemd" / "trio-supervisor.service").read_text()
OPERATIONS = (REPO / "docs" / "operations.md").read_text()


def _clients(nofile: int) -> str:
    return f"{derive(nofile, None).max_stream_clients:,}"


def test_the_units_figures_are_derived_from_its_limit() -> None:
    [limit] = re.findall(r"^LimitNOFILE=(\d+)$", UNIT, re.M)
    [(said_limit, said_clients)] = re.findall(r"(\d+) -> ([\d,]+) WebSocket clients", UNIT)
    assert said_limit == limit and said_clients == _clients(int(limit))
    assert "max_clients" not in UNIT


def test_the_operations_pages_figures_are_derived() -> None:
    stated = re.findall(r"LimitNOFILE=(\d+)`(?: \(or `ulimit -Hn`\))?\s+(?:gives|allows)\s+"
                        r"([\d,]+)", OPERATIONS)
    assert len(stated) >= 2, stated
    for limit, clients in stated:
        assert clients == _clients(int(limit)), (limit, clients)
