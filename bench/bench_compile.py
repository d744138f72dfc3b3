"""Benchmark: decode + compile of large revision bodies against a bare JSON decode.

Run from the repository root::

    python bench/bench_compile.py [--sizes 1000,10000,100000] [--runs 5] [--mapping]

For each size N the body holds N aliases and N keys (key i may use aliases i
and i+1), each key's secret an ``env:`` reference. Secrets come from the real
``os.environ`` (set for the run) unless ``--mapping`` injects a plain dict.

Printed per size: body size; the median CPU time of ``msgspec.json.decode(body)``
(the floor: parsing alone, no types, no checks) and of ``compile_revision``
(decode, validation, projection, secrets, snapshot), timed alternately; the
median of their per-run ratios; and the peak
memory growth of each, measured with tracemalloc in separate runs (tracemalloc
slows execution, so it never overlaps the timed runs), relative to the body
size. Aims: ratio <= 3 and compile memory growth <= 4x the body at 100,000.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping

import msgspec

from supervisor.revision import EnvFileResolver, compile_revision


def build(n: int) -> tuple[bytes, dict[str, str]]:
    aliases = {
        f"alias-{i:06d}": {
            "upstream": f"https://upstream-{i % 97:02d}.internal:8443/v1/models/m{i}",
            "timeout_s": 5 + i % 60,
            "retries": i % 4,
        }
        for i in range(n)
    }
    env = {f"BENCH_KEY_{i:06d}": f"sk-bench-{i:06d}-{'x' * 24}" for i in range(n)}
    keys = {
        f"key-{i:06d}": {
            "secret": f"env:BENCH_KEY_{i:06d}",
            "aliases": [f"alias-{i:06d}", f"alias-{(i + 1) % n:06d}"]
            if n > 1
            else ["alias-000000"],
        }
        for i in range(n)
    }
    body = msgspec.json.encode({"schema_version": 1, "aliases": aliases, "keys": keys})
    return body, env


def interleaved(
    floor: Callable[[], object], candidate: Callable[[], object], runs: int
) -> tuple[float, float, float]:
    """Median CPU seconds of each, and the median of their per-run ratios.

    Runs alternate and use process CPU time, so load from other processes on a
    shared machine inflates neither side (wall time would swing both ways).
    """
    floors, candidates, ratios = [], [], []
    for _ in range(runs):
        pair = []
        for fn in (floor, candidate):
            gc.collect()
            start = time.process_time()
            result = fn()
            pair.append(time.process_time() - start)
            del result
        floors.append(pair[0])
        candidates.append(pair[1])
        ratios.append(pair[1] / pair[0])
    return statistics.median(floors), statistics.median(candidates), statistics.median(ratios)


def peak_growth(fn: Callable[[], object]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del result
    finally:
        tracemalloc.stop()
    return peak - base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--mapping", action="store_true", help="inject secrets as a dict")
    args = parser.parse_args()

    print(
        f"python {sys.version.split()[0]}, msgspec {msgspec.__version__}, "
        f"secrets from {'a dict' if args.mapping else 'os.environ'}"
    )
    header = (
        f"{'aliases':>8} {'body MB':>8} {'floor ms':>9} {'compile ms':>11} {'ratio':>6}"
        f" {'floor mem/body':>15} {'compile mem/body':>17}"
    )
    print(header)
    worst_ratio = worst_mem = 0.0
    for n in (int(s) for s in args.sizes.split(",")):
        body, env = build(n)
        environ: Mapping[str, str]
        if args.mapping:
            environ = env
        else:
            os.environ.update(env)
            environ = os.environ
        resolver = EnvFileResolver(environ)

        def floor(body: bytes = body) -> object:
            return msgspec.json.decode(body)

        def compile_(body: bytes = body, resolver: EnvFileResolver = resolver) -> object:
            return compile_revision(body, revision=1, generation=1, resolver=resolver)

        compile_()  # warm up (and prove the body compiles)
        t_floor, t_compile, ratio = interleaved(floor, compile_, args.runs)
        m_floor = peak_growth(floor) / len(body)
        m_compile = peak_growth(compile_) / len(body)
        print(
            f"{n:>8} {len(body) / 1e6:>8.2f} {t_floor * 1e3:>9.1f} {t_compile * 1e3:>11.1f}"
            f" {ratio:>6.2f} {m_floor:>14.2f}x {m_compile:>16.2f}x"
        )
        if n >= 100_000:
            worst_ratio, worst_mem = max(worst_ratio, ratio), max(worst_mem, m_compile)
        if not args.mapping:
            for name in env:
                del os.environ[name]
    if worst_ratio:
        ok = worst_ratio <= 3.0 and worst_mem <= 4.0
        print(
            f"aims at 100,000 aliases (ratio <= 3, memory <= 4x body): {'met' if ok else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
