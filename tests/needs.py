"""What a test needs from the machine beyond the ``test`` extra, and what happens without it.

A test that needs a program pip cannot install (PgBouncer, promtool, the kube-apiserver
assets, ...) asks :func:`program` (or calls :func:`missing` for anything else) and is
skipped with a reason that names the program and how to get it; the conftest's summary
prints one line per such reason at the end of the run. With
``SUPERVISOR_TEST_REQUIRE_ALL=1`` (``.ci/run`` sets it) the same call fails the test
instead, so a machine that lost a program cannot turn a green run into a hollow one.

``SUPERVISOR_TEST_WITHOUT`` (names separated by commas) makes :func:`program` treat those
programs as absent although installed: how to see, on a full machine, what a newcomer's
run skips.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE_ALL_ENV = "SUPERVISOR_TEST_REQUIRE_ALL"
WITHOUT_ENV = "SUPERVISOR_TEST_WITHOUT"
# Every skip raised here starts so; the summary groups the skips by their reason.
PREFIX = "needs "


def require_all() -> bool:
    return os.environ.get(REQUIRE_ALL_ENV, "") not in ("", "0")


def missing(what: str, how: str) -> NoReturn:
    """Skip (or, with SUPERVISOR_TEST_REQUIRE_ALL=1, fail) the test: ``what`` is not here."""
    reason = f"{PREFIX}{what} ({how})"
    if require_all():
        pytest.fail(f"{reason}: {REQUIRE_ALL_ENV}=1 makes this a failure", pytrace=False)
    pytest.skip(reason)


def withheld(name: str) -> bool:
    return name in {n.strip() for n in os.environ.get(WITHOUT_ENV, "").split(",")}


def find(name: str, *, also: tuple[str, ...] = ()) -> str | None:
    """The program ``name`` from PATH or one of the folders ``also``; None when absent."""
    if withheld(name):
        return None
    found = shutil.which(name)
    if found is None:
        for folder in also:
            found = shutil.which(name, path=folder)
            if found is not None:
                break
    return found


def program(name: str, how: str, *, also: tuple[str, ...] = ()) -> str:
    """The path of program ``name``, else the test skips naming it and ``how`` to install it."""
    found = find(name, also=also)
    if found is None:
        missing(name, how)
    return found
