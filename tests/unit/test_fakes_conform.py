"""Each fake in tests/fakes/ implements the whole Protocol it stands in for, checked by mypy.

A fake module ends with a ``TYPE_CHECKING`` assignment of its class to
``type[<Protocol>]``; ``mypy --strict`` over the modules fails when a method of
the Protocol is missing from the fake or its signature differs, and the test
first shows that a drifted copy of a fake is caught. The fake API
server's modules are left out (they are checked by the tests that drive them
against a real kube-apiserver's behaviour, not against a Protocol of ours).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The fakes that stand in for one of our Protocols (RevisionAdmin, CacheFiles,
#: LeaseApi), and the two that stand in for concrete classes, checked for types alone.
PROTOCOL_FAKES = ("store.py", "cachefiles.py", "leases.py", "cache.py", "snapshot.py")


def _mypy(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--no-error-summary", *map(str, paths)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "MYPYPATH": str(ROOT)}, check=False,
    )


def test_the_fakes_match_their_protocols_and_a_drifted_fake_is_caught(tmp_path: Path) -> None:
    # A copy of FakeStore whose ``changes`` is misnamed: the run must name it, so
    # the check above is known to bite.
    source = (ROOT / "tests" / "fakes" / "store.py").read_text(encoding="utf-8")
    assert "    async def changes(self, limit" in source
    # A module name of its own each run: mypy's cache keys results by module name.
    drifted = tmp_path / f"drifted_store_{uuid.uuid4().hex}.py"
    drifted.write_text(source.replace("    async def changes(self, limit",
                                      "    async def changed(self, limit"), encoding="utf-8")
    result = _mypy(*(ROOT / "tests" / "fakes" / name for name in PROTOCOL_FAKES), drifted)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines, result.stderr
    assert all(line.startswith(str(drifted)) for line in lines), "\n".join(lines)
    assert any('"type[FakeStore]"' in line and "RevisionAdmin" in line for line in lines)
