"""What runs inside a forked worker: the mutant's import hook, then pytest.

The mutated module is served from a code object compiled in memory (its
original file name and line numbers kept), by a finder placed first on
``sys.meta_path``; nothing on disk changes. Everything under ``supervisor``
and ``tests.unit`` is dropped from ``sys.modules`` first, so every module
that imports the target binds the mutant.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import threading
import time
from collections.abc import Sequence
from types import CodeType, FrameType, ModuleType
from typing import Any

__all__ = ["run_pytest"]


class _MutantLoader(importlib.abc.Loader):
    def __init__(self, code: CodeType) -> None:
        self.code = code

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(self.code, module.__dict__)


class _MutantFinder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, code: CodeType) -> None:
        self.name = name
        self.code = code

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        original = importlib.machinery.PathFinder.find_spec(fullname, path)
        if original is None or original.origin is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, original.origin, loader=_MutantLoader(self.code),
            submodule_search_locations=original.submodule_search_locations,
        )


def _purge() -> None:
    for name in list(sys.modules):
        if name == "supervisor" or name.startswith(("supervisor.", "tests.unit")):
            del sys.modules[name]


def _quiet_hypothesis() -> None:
    # No example database (a mutant's failures must not be replayed by later
    # ordinary runs) and a fixed seed, so a mutant's fate does not vary by run.
    # 25 examples instead of 100 keeps a surviving mutant's run to seconds
    # (tests that set their own max_examples keep it).
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "mutation", database=None, derandomize=True, deadline=None, max_examples=25,
        suppress_health_check=list(HealthCheck),
    )
    settings.load_profile("mutation")


class _Tests:
    """A pytest plugin: knows the running test; keeps only ``selected`` tests when given."""

    def __init__(self, selected: Sequence[str] | None) -> None:
        self.current = ""
        self.selected = None if selected is None else set(selected)
        self.durations: dict[str, float] = {}
        # Tests during which CPython dropped the tracer (it raised: a RecursionError
        # of a deeply nesting test): the lines they ran after the drop are unknown.
        self.lost: list[str] = []
        self._started = 0.0
        self.tracer: Any = None

    def pytest_collection_modifyitems(self, config: Any, items: list[Any]) -> None:
        if self.selected is not None:
            kept = [item for item in items if item.nodeid in self.selected]
            config.hook.pytest_deselected(items=[i for i in items if i not in kept])
            items[:] = kept

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.current = nodeid
        self._started = time.monotonic()
        if self.tracer is not None:
            # CPython drops a tracer that raised (a RecursionError from a test
            # of deep nesting does): arm it again for every test.
            sys.settrace(self.tracer)

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        if self.tracer is not None and sys.gettrace() is not self.tracer:
            self.lost.append(nodeid)
        self.current = ""
        self.durations[nodeid] = time.monotonic() - self._started


def run_pytest(args: list[str], *, module: str | None = None, code: CodeType | None = None,
               trace_files: Sequence[str] = (), trace_out: str | None = None,
               selected: Sequence[str] | None = None) -> int:
    """Run pytest in this (forked) process.

    With ``trace_files``, record which tests execute each of their lines into
    ``trace_out`` as ``{"lines": {file: {line: [test ids]}}, "durations": {test id:
    seconds}, "lost": [test ids]}`` (the id ``""``: outside any test, at import or
    collection; ``lost``: tests that lost the tracer midway, so may run any line).
    With ``selected``, run only those test ids.
    """
    _purge()
    _quiet_hypothesis()
    if module is not None and code is not None:
        sys.meta_path.insert(0, _MutantFinder(module, code))
    tests = _Tests(selected)
    lines: dict[str, dict[int, dict[str, None]]] = {name: {} for name in trace_files}

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        seen = lines.get(frame.f_code.co_filename)
        if seen is None:
            return None  # no local tracing outside the target files
        if event in ("line", "call"):
            seen.setdefault(frame.f_lineno, {})[tests.current] = None
        return tracer

    if trace_files:
        tests.tracer = tracer
        threading.settrace(tracer)
        sys.settrace(tracer)
    import pytest

    try:
        status = int(pytest.main(args, plugins=[tests]))
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
    if trace_out is not None:
        with open(trace_out, "w") as f:
            json.dump({"lines": {name: {str(line): list(ids) for line, ids in seen.items()}
                                 for name, seen in lines.items()},
                       "durations": tests.durations, "lost": tests.lost}, f)
    return status
