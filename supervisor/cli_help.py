"""The words of ``trio-supervisor --help``: one entry per subcommand.

Each :class:`CommandHelp` gives the one-line summary shown in the top-level
list, a one-paragraph description, two examples and the exit codes, which
:func:`epilog` renders below argparse's option list. Everything here refers to
the installed command and the repository's own files (``README.rst``,
``conf/``), never to documents outside it. ``tests/unit/test_cli_help.py``
walks the parser and fails on any subcommand or option without help.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMMANDS", "EXIT_CODES", "PROGRAM", "CommandHelp", "epilog"]


@dataclass(frozen=True)
class CommandHelp:
    summary: str
    description: str
    examples: tuple[str, str]
    exits: tuple[tuple[int, str], ...]


PROGRAM = (
    "Keeps a config snapshot equal to the control plane's desired revision (PostgreSQL or "
    "SQLite), fans out Kubernetes resources, and serves an admin API. Without a subcommand "
    "it runs the daemon. The configuration file is named by --config or $SUPERVISOR_CONFIG; "
    "every key can be overridden as SUPERVISOR_<SECTION>__<KEY>. Reference: README.rst and "
    "docs/ in the source tree."
)

EXIT_CODES = (
    (0, "clean shutdown after SIGTERM/SIGINT, or the command succeeded"),
    (1, "anything else (a retry or restart may succeed: admin address in use, "
        "control plane unreachable)"),
    (2, "bad usage or invalid configuration: no restart fixes it"),
    (3, "refused to boot: nothing servable (the log line's reason names why)"),
    (4, "supervision gave up: a child exceeded [supervisor].restart_intensity"),
)

COMMANDS: dict[str, CommandHelp] = {
    "run": CommandHelp(
        "run the daemon (the default when no subcommand is given)",
        "Runs the daemon in the foreground: the convergence loop, the LISTEN child "
        "(PostgreSQL), the Kubernetes fan-out when [kubernetes].enabled, and the admin API "
        "on [admin].listen. Logs go to stderr (console lines on a terminal, JSON lines "
        "otherwise, JSON with syslog priorities under journald). SIGTERM/SIGINT stop it "
        "gracefully, SIGHUP re-reads [log].level and converges now. Under systemd it "
        "sends READY=1, STATUS= and WATCHDOG=1.",
        ("trio-supervisor run --config /etc/trio-supervisor/prod.toml",
         "SUPERVISOR_LOG__LEVEL=debug trio-supervisor --config conf/dev.toml"),
        EXIT_CODES,
    ),
    "check": CommandHelp(
        "validate the configuration and the files it names",
        "Validates the configuration file the way the daemon would at start: TOML syntax, "
        "unknown keys (with a suggestion for a likely typo), types and bounds, environment "
        "overrides, then the files it names (token file, signing key, trusted keys, "
        "directories of the cache, snapshot and SQLite files). Every problem is printed as "
        "FILE: $.section.key: reason. Nothing is started and nothing is written.",
        ("trio-supervisor check --config /etc/trio-supervisor/prod.toml",
         "SUPERVISOR_ADMIN__LISTEN=0.0.0.0:9464 trio-supervisor check --config conf/prod.toml"),
        ((0, "the configuration is valid"),
         (2, "invalid: each problem printed with its key path")),
    ),
    "db": CommandHelp(
        "create or upgrade the control-plane schema",
        "ACTION migrate creates or upgrades the control-plane tables (PostgreSQL or SQLite) "
        "named by [control_plane].url. Running it twice is harmless. Run the new build's "
        "migrate before rolling the daemons during an upgrade: replicas of the previous "
        "version keep working on the migrated schema.",
        ("trio-supervisor db migrate --config /etc/trio-supervisor/prod.toml",
         "SUPERVISOR_CONTROL_PLANE__URL=postgresql://supervisor@db/cp trio-supervisor db "
         "migrate --config prod.toml"),
        ((0, "the schema is up to date"),
         (1, "the control plane could not be reached or refused the change"),
         (2, "bad usage or invalid configuration")),
    ),
    "publish": CommandHelp(
        "validate a revision document, store it and make it desired",
        "Reads FILE (a TOML or JSON revision document, schema_version 1; see "
        "conf/example-revision.toml), validates it and compiles it as the daemon would "
        "(secret references are checked for shape, not resolved: the secrets may exist only "
        "on the daemon's hosts), then stores it and makes it the desired revision in one "
        "transaction. Running daemons pick it up on their next poll, or at once with "
        "LISTEN. The new revision id is the last line of stdout.",
        ("trio-supervisor publish --config prod.toml revision.toml --message 'add team-b'",
         "rev=$(trio-supervisor publish --config prod.toml revision.json | tail -n1)"),
        ((0, "stored and desired; the id printed last"),
         (1, "the control plane could not be reached or refused the write"),
         (2, "FILE is missing or invalid (the reason label and $.path printed); "
             "nothing was stored")),
    ),
    "status": CommandHelp(
        "print the running replica's status report",
        "Fetches GET /status from a running replica's admin API and prints it as a table: "
        "the desired, loaded and active revisions, whether the control plane is up, the "
        "last rejection, the supervised children and the fan-out watchers. The address and "
        "the token come from --config ([admin].listen and [admin].token_file), or from --url "
        "and --token-file. Exits 1 when the replica is unreachable, not ready (no active "
        "snapshot) or a child has failed, so it works as a health check in scripts.",
        ("trio-supervisor status --config /etc/trio-supervisor/prod.toml",
         "trio-supervisor status --url http://replica-2.internal:9464 "
         "--token-file admin.token --json"),
        ((0, "the replica is ready and every child is alive"),
         (1, "unreachable, token refused, not ready, or a child has failed"),
         (2, "bad usage or invalid configuration")),
    ),
    "watch": CommandHelp(
        "follow the live stream, one JSON line per event",
        "Follows the replica's WebSocket stream (/v1/stream) and prints one compact JSON "
        "line per message: first the current state, then published, rejected and status "
        "events. A lost connection is retried with backoff (each new connection starts "
        "with a fresh status line) unless --no-reconnect. Pipe it to jq to pick fields.",
        ("trio-supervisor watch --config /etc/trio-supervisor/prod.toml",
         "trio-supervisor watch --url ws://127.0.0.1:9464/v1/stream --no-reconnect | jq .type"),
        ((0, "the stream was closed cleanly (with --no-reconnect), or interrupted"),
         (1, "unreachable, token refused, or the stream was lost (with --no-reconnect)"),
         (2, "bad usage or invalid configuration")),
    ),
    "keygen": CommandHelp(
        "write a new Ed25519 signing key for the last-known-good cache",
        "Writes a new Ed25519 signing key to --out (mode 0600; an existing file is never "
        "overwritten) and prints its verify key as the last word of the last line, in the "
        "form [cache].trusted_keys accepts. Point [cache].signing_key at the file and add "
        "the verify key to [cache].trusted_keys of every replica that should accept caches "
        "signed with it (README.rst, 'Cache key rotation').",
        ("trio-supervisor keygen --out /etc/trio-supervisor/cache-signing.key",
         "trio-supervisor keygen --out new.key | tail -n1 | awk '{print $NF}'"),
        ((0, "written; the verify key printed last"),
         (1, "the file exists or cannot be written")),
    ),
}


def epilog(help_: CommandHelp) -> str:
    """Examples and exit codes, laid out for ``RawDescriptionHelpFormatter``."""
    lines = ["examples:"]
    lines += [f"  {example}" for example in help_.examples]
    lines += ["", "exit codes:"]
    lines += [f"  {code}  {meaning}" for code, meaning in help_.exits]
    return "\n".join(lines)


def program_epilog() -> str:
    lines = ["examples:",
             "  trio-supervisor check --config conf/dev.toml",
             "  trio-supervisor --config conf/dev.toml          # run the daemon",
             "", "exit codes (of run; each subcommand's --help lists its own):"]
    lines += [f"  {code}  {meaning}" for code, meaning in EXIT_CODES]
    return "\n".join(lines)
