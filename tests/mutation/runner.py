"""Run the mutants of each target group against the group's own unit tests.

Each mutant runs in a forked copy of this process (the test dependencies are
imported once, before forking), with the mutated module served from memory
(:mod:`tests.mutation.child`): the working tree is never written. One baseline
run per group first checks that the tests pass unmutated, times each test (a
mutant's timeout is 10 s plus three times the baseline duration of the tests it
runs; a timeout counts as killed) and records which tests execute which lines: a mutant runs only the tests that
execute its line (all of them for a line that runs at import), plus any test
during which CPython dropped the tracer (a deep recursion makes the tracer
raise), and a mutant on a line no test executes is reported as surviving
without being run.

The equivalents file (``tests/mutation/equivalent.txt``) lists mutants that
cannot change behaviour, one a line: the mutant id, whitespace, a one-line
reason. They are excluded from the score; an id no longer produced is reported
as stale. Exit status 1 when a group misses its aim, 2 when a baseline fails.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType

from tests.mutation.operators import ALL_OPERATORS, DEFAULT_OPERATORS, Site, apply_site, find_sites

__all__ = ["TARGETS", "main"]

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENTS = Path(__file__).with_name("equivalent.txt")
# anyio's plugin costs a second per run and no unit test uses it; the preloaded
# plugins cannot be assertion-rewritten again, which pytest would warn about.
PYTEST_ARGS = ["-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-p", "no:anyio",
               "--no-header", "-o", "addopts=", "-m", "not chaos and not slow",
               "-W", "ignore::pytest.PytestAssertRewriteWarning"]


@dataclass(frozen=True)
class Target:
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    aim: float  # per cent, for every module of the group


TARGETS: dict[str, Target] = {
    # The supervision tree and the backoff its restarts wait (exponent, cap, jitter bounds).
    "tree": Target(("supervisor/tree.py", "supervisor/backoff.py"),
                   ("tests/unit/test_tree_restarts_and_shutdown.py", "tests/unit/test_tree.py",
                    "tests/unit/test_tree_stuck_start.py",
                    "tests/unit/test_backoff.py"), 90.0),
    # The cache: supervisor/sinks/lkg/ and the atomic write it stores every file with.
    "lkg": Target(
        (*(f"supervisor/sinks/lkg/{m}.py" for m in ("cache", "mark", "keys", "fileformat",
                                                     "files", "errors")),
         "supervisor/sinks/atomic.py"),
        ("tests/unit/test_lkg_files.py",
         "tests/unit/test_lkg_safety.py", "tests/unit/test_lkg.py", "tests/unit/test_atomic.py"),
        90.0),
    # Follower mode: the store that judges an upstream's statements, and the statement
    # and highest-accepted code it judges them with.
    "follower": Target(
        ("supervisor/controlplane/follower.py", "supervisor/sinks/lkg/statement.py",
         "supervisor/sinks/lkg/accepted.py"),
        ("tests/unit/test_statement.py", "tests/unit/test_follower_store.py",
         "tests/unit/test_follower_never_goes_back.py"),
        90.0),
    # The bounds every boundary uses: cut, quoted, shown, the range and size checks, the
    # capped read, the worker-thread hand-offs.
    "bounds": Target(("supervisor/bounds.py", "supervisor/threads.py"),
                     ("tests/unit/test_boundaries.py", "tests/unit/test_thread_handoffs.py"),
                     90.0),
    "revision": Target(
        tuple(f"supervisor/revision/{m}.py" for m in ("document", "compile", "snapshot",
                                                       "secrets", "errors", "files")),
        ("tests/unit/test_revision_refusals.py", "tests/unit/test_revision_document.py",
         "tests/unit/test_revision_compile.py", "tests/unit/test_revision_properties.py"),
        90.0),
    "convergence": Target(
        tuple(f"supervisor/convergence/{m}.py" for m in ("loop", "schedule",
                                                          "side_sinks", "reporting", "outcome",
                                                          "signal", "status")),
        tuple(f"tests/unit/convergence/test_{m}.py" for m in (
            "publishing", "refusals", "outages", "wakeups", "converge_requests", "bootstrap",
            "side_sinks", "statements", "status", "refusal_log")),
        90.0),
}


@dataclass
class Result:
    module: str
    sites: list[Site]
    log_calls: int
    killed: list[Site] = field(default_factory=list)
    survived: list[Site] = field(default_factory=list)
    uncovered: list[Site] = field(default_factory=list)
    equivalent: list[Site] = field(default_factory=list)
    timeouts: int = 0
    invalid: list[Site] = field(default_factory=list)  # do not compile: not mutants

    @property
    def counted(self) -> int:
        return len(self.killed) + len(self.survived) + len(self.uncovered)

    @property
    def score(self) -> float:
        return 100.0 * len(self.killed) / self.counted if self.counted else 100.0


def _module_name(path: str) -> str:
    name = path.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def read_equivalents(path: Path = EQUIVALENTS) -> dict[str, str]:
    """{mutant id: reason} from the equivalents file (``#`` starts a comment line)."""
    found: dict[str, str] = {}
    if not path.exists():
        return found
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        mutant_id, _, reason = line.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{path}:{number}: an equivalent mutant needs a one-line reason")
        found[mutant_id] = reason.strip()
    return found


def _preload() -> None:
    """Import what the tests need once, so each forked mutant starts in milliseconds."""
    import hypothesis  # noqa: F401
    import msgspec  # noqa: F401
    import nacl.signing  # noqa: F401
    import prometheus_client  # noqa: F401
    import psycopg  # noqa: F401
    import pytest  # noqa: F401
    import pytest_trio  # noqa: F401
    import structlog  # noqa: F401
    import trio  # noqa: F401
    import trio.testing  # noqa: F401


class _Job:
    def __init__(self, pid: int, site: Site | None, log_path: str, deadline: float) -> None:
        self.pid = pid
        self.site = site
        self.log_path = log_path
        self.deadline = deadline


def _fork(args: list[str], log_path: str, **kwargs: object) -> int:
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 3
        try:
            os.setsid()
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            from tests.mutation.child import run_pytest

            status = run_pytest(args, **kwargs)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - the child reports and exits, always
            print(f"mutation child failed: {exc!r}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    return pid


def _reap(job: _Job, *, block: bool) -> int | None:
    """The exit status, None while running; kills the job's group past its deadline."""
    pid, status = os.waitpid(job.pid, 0 if block else os.WNOHANG)
    if pid == 0:
        if time.monotonic() < job.deadline:
            return None
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(job.pid, 0)
        return -1
    return os.waitstatus_to_exitcode(status)


Coverage = dict[str, dict[int, list[str]]]  # file -> line -> ids of the tests executing it


def _baseline(target: Target, tests: list[str],
              workdir: str) -> tuple[float, Coverage, dict[str, float], list[str]]:
    import json

    files = [str(ROOT / m) for m in target.modules]
    trace_out = os.path.join(workdir, "baseline.json")
    log_path = os.path.join(workdir, "baseline.log")
    start = time.monotonic()
    job = _Job(_fork([*PYTEST_ARGS, *tests], log_path, trace_files=files, trace_out=trace_out),
               None, log_path, float("inf"))
    status = _reap(job, block=True)
    took = time.monotonic() - start
    if status != 0:
        sys.stdout.write(Path(log_path).read_text()[-4000:])
        raise SystemExit(2)
    with open(trace_out) as f:
        traced = json.load(f)
    lines = {name: {int(line): ids for line, ids in found.items()}
             for name, found in traced["lines"].items()}
    return took, lines, traced["durations"], traced["lost"]


def run_group(name: str, target: Target, *, jobs: int, operators: tuple[str, ...],
              sample: int | None, seed: int, equivalents: dict[str, str],
              used_equivalents: set[str], only: frozenset[str] = frozenset()) -> list[Result]:
    tests = [t for t in target.tests if (ROOT / t).exists()]
    with tempfile.TemporaryDirectory(prefix=f"mutation-{name}-") as workdir:
        took, covered, durations, lost = _baseline(target, tests, workdir)
        print(f"== {name}: baseline {took:.1f} s (traced) over {len(tests)} test files",
              flush=True)
        results: list[Result] = []
        queue: list[tuple[Result, Site, str, list[str] | None]] = []
        for path in target.modules:
            source = (ROOT / path).read_text()
            sites, log_calls = find_sites(source, path, operators)
            if only:
                sites = [s for s in sites if s.mutant_id in only]
            if sample is not None and len(sites) > sample:
                sites = sorted(random.Random(f"{seed}:{path}").sample(sites, sample),
                               key=lambda s: s.index)
            result = Result(path, sites, log_calls)
            results.append(result)
            lines = covered.get(str(ROOT / path), {})
            for site in sites:
                if site.mutant_id in equivalents:
                    used_equivalents.add(site.mutant_id)
                    result.equivalent.append(site)
                elif site.line not in lines and not lost and site.qualname != "<module>":
                    result.uncovered.append(site)
                else:
                    # Only the tests that execute the mutated line, unless it
                    # runs at import (a constant, a default; module-level code
                    # even where the compiler folded the line away, as the
                    # members of a constant frozenset): then all of them;
                    # and the tests whose trace was cut short, which may run it.
                    ids = lines.get(site.line, [])
                    at_import = "" in ids or site.qualname == "<module>"
                    selected = None if at_import else list(dict.fromkeys([*ids, *lost]))
                    queue.append((result, site, source, selected))
        running: list[tuple[_Job, Result]] = []
        done = 0
        started = time.monotonic()
        while queue or running:
            while queue and len(running) < jobs:
                result, site, source, selected = queue.pop(0)
                path = str(ROOT / result.module)
                try:
                    code = apply_site(source, path, site.index, operators)
                except SyntaxError:
                    # e.g. the one binding of a name a nested function declares
                    # nonlocal removed: no program, so nothing to test.
                    result.invalid.append(site)
                    continue
                assert isinstance(code, CodeType)
                log_path = os.path.join(workdir, f"{site.mutant_id}.log")
                # Only the files holding the selected tests: less to collect.
                files = tests if selected is None else [
                    t for t in tests if any(i.startswith(f"{t}::") for i in selected)]
                ran = durations.values() if selected is None else (
                    durations.get(i, 0.0) for i in selected)
                timeout = 10 + 3 * sum(ran)
                pid = _fork([*PYTEST_ARGS, *files], log_path, selected=selected,
                            module=_module_name(result.module), code=code)
                running.append((_Job(pid, site, log_path, time.monotonic() + timeout), result))
            for entry in list(running):
                job, result = entry
                status = _reap(job, block=False)
                if status is None:
                    continue
                running.remove(entry)
                done += 1
                if done % 25 == 0:
                    print(f"   {done}/{done + len(running) + len(queue)} mutants run, "
                          f"{time.monotonic() - started:.0f} s", flush=True)
                assert job.site is not None
                if status in (0, 5):  # 5: no test ran, which notices nothing
                    result.survived.append(job.site)
                else:
                    result.killed.append(job.site)
                    result.timeouts += status == -1
            time.sleep(0.02)
        print(f"   {done} mutants run in {time.monotonic() - started:.0f} s", flush=True)
        return results


def _report(result: Result, aim: float) -> bool:
    met = result.score >= aim
    print(f"{result.module}: {len(result.sites)} mutants, {len(result.killed)} killed "
          f"({result.timeouts} by timeout), {len(result.survived)} survived, "
          f"{len(result.uncovered)} not executed by the tests, {len(result.equivalent)} "
          f"equivalent and {len(result.invalid)} not compilable (excluded); "
          f"{result.log_calls} log calls not mutated; "
          f"score {result.score:.1f} % (aim {aim:.0f} %: {'met' if met else 'MISSED'})")
    for kind, sites in (("survived", result.survived), ("not executed", result.uncovered)):
        for site in sorted(sites, key=lambda s: s.line):
            print(f"  {kind:12} {result.module}:{site.line} {site.mutant_id} "
                  f"[{site.qualname}] {site.op}: {site.description}")
    return met


def _report_group(name: str, results: list[Result], aim: float) -> None:
    counted = sum(r.counted for r in results)
    killed = sum(len(r.killed) for r in results)
    score = 100.0 * killed / counted if counted else 100.0
    print(f"== {name} (all modules): {sum(len(r.sites) for r in results)} mutants, "
          f"{killed} killed, {sum(len(r.equivalent) for r in results)} equivalent; "
          f"score {score:.1f} % (aim {aim:.0f} % per module)", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="*", choices=[[], *TARGETS], metavar="GROUP",
                        help=f"groups to run (default all): {', '.join(TARGETS)}")
    parser.add_argument("--module", action="append", default=[],
                        help="only this module of the group(s), e.g. supervisor/sinks/lkg/keys.py")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--operators", default=",".join(DEFAULT_OPERATORS),
                        help=f"comma-separated, of {', '.join(ALL_OPERATORS)}")
    parser.add_argument("--sample", type=int, default=None,
                        help="run at most N mutants per module, a seeded random sample")
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--mutant", action="append", default=[], metavar="ID",
                        help="only this mutant (the id the run prints); repeatable")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    args = parser.parse_args(argv)
    operators = tuple(op for op in args.operators.split(",") if op)
    unknown = set(operators) - set(ALL_OPERATORS)
    if unknown:
        parser.error(f"unknown operators: {sorted(unknown)}")
    os.chdir(ROOT)
    equivalents = read_equivalents()
    used: set[str] = set()
    all_met = True
    for name in args.groups or list(TARGETS):
        target = TARGETS[name]
        if args.module:
            target = Target(tuple(m for m in target.modules if m in args.module),
                            target.tests, target.aim)
            if not target.modules:
                continue
        if args.list:
            for path in target.modules:
                sites, _ = find_sites((ROOT / path).read_text(), path, operators)
                for site in sites:
                    print(f"{path}:{site.line} {site.mutant_id} [{site.qualname}] "
                          f"{site.op}: {site.description}")
            continue
        _preload()
        results = run_group(name, target, jobs=args.jobs, operators=operators,
                            sample=args.sample, seed=args.seed, equivalents=equivalents,
                            used_equivalents=used, only=frozenset(args.mutant))
        for result in results:
            if args.mutant and not result.sites:
                continue  # only named mutants: say nothing of the other modules
            all_met = _report(result, target.aim) and all_met
        _report_group(name, results, target.aim)
    if (not args.list and not args.module and not args.groups and not args.mutant
            and args.sample is None and operators == DEFAULT_OPERATORS):
        for stale in sorted(set(equivalents) - used):
            print(f"stale equivalent entry (no such mutant any more): {stale}")
    return 0 if all_met or args.list else 1
