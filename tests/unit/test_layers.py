"""The package's layering holds: no part imports a sibling above it.

Layers, bottom to top (``TYPE_CHECKING`` imports count too: they are design
dependencies even when they cost nothing at run time)::

    4  app, health, cli, commands, __main__, cli_help, completion   (assembly)
    3  admin                                                 (reads what the loops report)
    2  convergence | fanout                                  (side by side, never each other)
    1  controlplane | kube | revision | sinks | lifecycle | tree
    0  errors, reasons, logs, backoff, wakeup, streak, events, telemetry, config,
       configchecks, configfile, filemodes, tokenfile, dsn, statedirs, texttable, tlsconfig,
       status_doc

A part may import parts of lower layers, and only the listed pairs within one
layer (the shared parts use each other, so do the commands; sinks store
compiled revisions; the follower store reads the cache's signed format).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "supervisor"

LAYERS = {
    0: {"errors", "reasons", "logs", "backoff", "wakeup", "streak", "events", "telemetry",
        "config", "configchecks", "configfile", "filemodes", "tokenfile", "dsn", "statedirs",
        "texttable",
        "tlsconfig", "status_doc", "bounds", "threads",
        "__init__"},
    1: {"controlplane", "kube", "revision", "sinks", "lifecycle", "tree"},
    2: {"convergence", "fanout"},
    3: {"admin"},
    4: {"app", "health", "cli", "commands", "__main__", "cli_help", "completion"},
}
RANK = {part: rank for rank, parts in LAYERS.items() for part in parts}
# controlplane -> sinks: the follower store (controlplane/follower.py) verifies
# the upstream's revision with the signed cache file format (sinks/lkg).
SAME_LAYER_ALLOWED = {("sinks", "revision"), ("controlplane", "sinks")} | {
    (a, b) for layer in (0, 4) for a in LAYERS[layer] for b in LAYERS[layer]}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        source = part_of(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "supervisor":
                    targets = [f"supervisor.{alias.name}" for alias in node.names]
                elif node.module.startswith("supervisor."):
                    targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("supervisor.")]
            for target in targets:
                dest = part_of(target)
                if dest == "__version__":
                    dest = "__init__"
                if dest != source:
                    found.add((source, dest, module))
    return found


def test_every_part_has_a_layer() -> None:
    parts = {part_of(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts))
             for p in PACKAGE.rglob("*.py")}
    assert parts <= set(RANK), f"give these a layer in this test: {parts - set(RANK)}"


def test_no_part_imports_one_above_it_or_a_sibling() -> None:
    wrong = sorted(
        f"{module} imports {dest} (layer {RANK[dest]}) from layer {RANK[source]}"
        for source, dest, module in imports()
        if RANK[dest] > RANK[source]
        or (RANK[dest] == RANK[source] and (source, dest) not in SAME_LAYER_ALLOWED)
    )
    assert not wrong, "\n".join(wrong)


def test_the_check_would_catch_a_violation() -> None:
    # The rule itself: convergence importing fanout (siblings) is refused.
    assert RANK["convergence"] == RANK["fanout"]
    assert ("convergence", "fanout") not in SAME_LAYER_ALLOWED
    assert RANK["controlplane"] < RANK["convergence"]


def test_the_daemon_never_parses_its_own_source() -> None:
    # Harvesting log events or docstrings from the syntax tree is the docs
    # generator's job (tools/docsgen), which is not installed with the daemon.
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not {"ast", "inspect", "tokenize"} & set(names), path
