"""Shared fixtures: the PostgreSQL server of the run, a fresh database per test; the summary.

``pg_server`` is the one server every PostgreSQL test uses (tests/pgserver.py: the one
``SUPERVISOR_TEST_PG`` names, else the one on 127.0.0.1:5432, else a private one the suite
starts and stops); ``pg_url`` is a new database on it for one test.

At the end of the run one line names that server, and one line per reason counts the
tests skipped for a program or package this machine lacks (tests/needs.py).
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from tests import needs, pgserver
from tests.pgserver import Server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    try:
        yield pgserver.provide()
    finally:
        pgserver.release()


@pytest.fixture
def pg_url(pg_server: Server) -> Iterator[str]:
    """A DSN to a new, empty database, dropped after the test."""
    name = f"tsup_{uuid.uuid4().hex[:12]}"
    with pg_server.admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_server.url(name)
    finally:
        with pg_server.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    return f"sqlite:///{os.fspath(tmp_path)}/controlplane.db"


def _skip_reason(report: pytest.TestReport) -> str | None:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return None


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker a core, at most four (every test starts daemons of its own,
    which need the cores too)."""
    return max(1, min(os.cpu_count() or 1, 4))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    server = pgserver.current()
    lines = [server.describe()] if server is not None else []
    reasons = Counter(reason for report in terminalreporter.stats.get("skipped", [])
                      if (reason := _skip_reason(report)) and reason.startswith(needs.PREFIX))
    for reason, count in sorted(reasons.items()):
        lines.append(f"{count} skipped: {reason}")
    if reasons:
        lines.append(f"({needs.REQUIRE_ALL_ENV}=1 makes these failures; .ci/run sets it)")
    if lines:
        terminalreporter.section("what this run used and what it skipped", sep="-")
        for line in lines:
            terminalreporter.write_line(line)
