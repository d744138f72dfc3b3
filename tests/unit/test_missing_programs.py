"""A test that needs a program pip cannot install skips naming it, or fails when all are required.

The end-of-run summary (tests/conftest.py) prints one line per missing program; a pytest
run of a small test file with the project's conftest as a plugin shows it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import needs

REPO = Path(__file__).resolve().parents[2]
HOW = "apt-get install no-such-program"


def test_a_missing_program_skips_naming_it_and_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(needs.REQUIRE_ALL_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"needs no-such-program \\({HOW}\\)"):
        needs.program("no-such-program", HOW)


def test_require_all_turns_the_skip_into_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(needs.REQUIRE_ALL_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="needs no-such-program") as info:
        needs.program("no-such-program", HOW)
    assert needs.REQUIRE_ALL_ENV in str(info.value)


def test_without_hides_an_installed_program(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(needs.REQUIRE_ALL_ENV, raising=False)
    assert needs.program("sh", HOW).endswith("/sh")
    monkeypatch.setenv(needs.WITHOUT_ENV, "pgbouncer, sh")
    with pytest.raises(pytest.skip.Exception, match="needs sh"):
        needs.program("sh", HOW)


def test_a_program_outside_path_is_found_in_the_folders_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = str(Path(sys.executable).parent)
    name = Path(sys.executable).name
    monkeypatch.setenv("PATH", "/nonexistent")
    assert needs.find(name) is None
    assert needs.find(name, also=(folder,)) == sys.executable


SAMPLE = '''
from tests import needs

def test_one():
    needs.program("no-such-program", "apt-get install no-such-program")

def test_two():
    needs.program("no-such-program", "apt-get install no-such-program")

def test_three():
    needs.missing("kube-apiserver and etcd", "set SUPERVISOR_TEST_KUBE_ASSETS")

def test_runs():
    assert True
'''


def _run_sample(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    environ = {k: v for k, v in os.environ.items() if k != needs.REQUIRE_ALL_ENV}
    environ.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-q", "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_sample.py")],
        capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=120, check=False)


def test_the_summary_prints_one_line_per_missing_program(tmp_path: Path) -> None:
    result = _run_sample(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "2 skipped: needs no-such-program (apt-get install no-such-program)" in lines
    assert ("1 skipped: needs kube-apiserver and etcd (set SUPERVISOR_TEST_KUBE_ASSETS)"
            in lines)
    assert "1 passed, 3 skipped" in result.stdout
    # No test touched PostgreSQL: the run started none and names none.
    assert "PostgreSQL" not in result.stdout


def test_the_same_run_fails_when_every_program_is_required(tmp_path: Path) -> None:
    result = _run_sample(tmp_path, **{needs.REQUIRE_ALL_ENV: "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "3 failed, 1 passed" in result.stdout
