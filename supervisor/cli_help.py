"""The words of ``trio-supervisor --help``: one entry per subcommand.

They refer to the installed command and the repository's own files (``README.rst``,
``conf/``), never outside it. ``tests/unit/test_cli_help.py`` fails on an option without help.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMMANDS", "EXIT_CODES", "PROGRAM", "CommandHelp", "epilog"]


@dataclass(frozen=True)
class CommandHelp:
    """One subcommand's words: summary, description, two examples and its exit codes.

    The summary is its line in the top-level list; :func:`epilog` renders the rest
    below argparse's option list.
    """
    summary: str
    description: str
    examples: tuple[str, str]
    exits: tuple[tuple[int, str], ...]


PROGRAM = (
    "Keeps a config snapshot equal to the control plane's desired revision (PostgreSQL or "
    "SQLite), fans out Kubernetes resources, and serves an admin API. Without a subcommand "
    "it runs the daemon. The configuration file is named by --config or $SUPERVISOR_CONFIG; "
    "every key can be overridden as SUPERVISOR_<SECTION>__<KEY>. Each command's --help lists "
    "its options, examples and exit codes; the full reference is the project's README.rst "
    "and docs/ (the systemd install steps put README.rst in /usr/share/doc/trio-supervisor)."
)

EXIT_CODES = (
    (0, "clean shutdown after SIGTERM/SIGINT (run, watch), or the command succeeded"),
    (1, "anything else (a retry or restart may succeed: admin address in use, "
        "control plane unreachable; another command interrupted by Ctrl-C, or its "
        "stdout closed)"),
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
        "gracefully, SIGHUP re-reads [log].level (naming any changed key that needs a "
        "restart) and converges now. Under systemd it "
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
        "FILE: $.section.key: reason. Last, a read-only look at the control plane (2 s at "
        "most, whatever the DSN's connect_timeout): a schema a newer build migrated is a "
        "problem; an unreachable, slow or not yet migrated one is not. Nothing is started "
        "and nothing is written.",
        ("trio-supervisor check --config /etc/trio-supervisor/prod.toml",
         "SUPERVISOR_ADMIN__LISTEN=0.0.0.0:9464 trio-supervisor check --config conf/prod.toml"),
        ((0, "the configuration is valid"),
         (2, "invalid: each problem printed with its key path")),
    ),
    "db": CommandHelp(
        "create or upgrade the control-plane schema; prune old revisions",
        "ACTION migrate creates or upgrades the control-plane tables (PostgreSQL or SQLite) "
        "named by [control_plane].url. Running it twice is harmless. Run the new build's "
        "migrate before rolling the daemons during an upgrade: replicas of the previous "
        "version keep working on the migrated schema. ACTION prune --keep N deletes every "
        "revision older than the newest N, in one transaction, and never the desired one "
        "(so a rollback target in use survives); running it twice is harmless. Before "
        "deleting, prune asks on a terminal (y/N); elsewhere it needs --yes. --dry-run "
        "lists what it would delete and deletes nothing.",
        ("trio-supervisor db migrate --config /etc/trio-supervisor/prod.toml",
         "trio-supervisor db prune --keep 50 --yes --config prod.toml"),
        ((0, "the schema is up to date / the old revisions are deleted (or, --dry-run, "
             "listed)"),
         (1, "the control plane could not be reached or refused the change; prune "
             "declined at its question"),
         (2, "bad usage (prune without --keep, or without --yes and no terminal to ask), "
             "invalid configuration, or (prune) a schema older than this build's: run db "
             "migrate")),
    ),
    "publish": CommandHelp(
        "validate a revision document, store it and make it desired",
        "Reads FILE (a TOML or JSON revision document, schema_version 1; see "
        "conf/example-revision.toml), validates it and compiles it as the daemon would, "
        "then stores it and makes it the desired revision in one transaction. Secret "
        "references are checked for shape only, unless --resolve-secrets (or --dry-run) "
        "resolves them in this environment, as on a replica's host. --dry-run stores "
        "nothing and prints the changes against the desired revision. --wait follows each "
        "--url replica's stream until it reports the revision active (0) or refused (5, "
        "the reason label and detail on the last line). The first line names the store "
        "written (an SQLite file by its absolute path) and the change's sequence; a body "
        "identical to the desired one's is not stored again unless --force. The new "
        "revision id is the last line of stdout on success.",
        ("trio-supervisor publish --config prod.toml revision.toml --message 'add team-b'",
         "trio-supervisor publish --config prod.toml revision.toml --wait "
         "--url http://replica-1:9464 --url http://replica-2:9464 --timeout 60"),
        ((0, "stored and desired (with --wait: active on every replica); the id printed "
             "last. --dry-run: it would be accepted"),
         (1, "the control plane could not be reached or refused the write; with --wait: "
             "a replica timed out, was unreachable, or already serves a newer revision"),
         (2, "FILE is missing, not a regular file, over max_revision_bytes or invalid, or "
             "(--dry-run, --resolve-secrets) a secret cannot be resolved here: the reason "
             "label and $.path printed; or the control plane's schema is older than this "
             "build's (run db migrate), or this replica is a follower; nothing was "
             "stored"),
         (5, "with --wait: a replica refused the revision (the reason on the last line)")),
    ),
    "history": CommandHelp(
        "list the stored revisions, newest first, marking the desired one",
        "Lists the revisions in the control plane, newest first: id, creation time (UTC), "
        "schema_version, body size, the first 12 hex digits of the body's SHA-256 and the "
        "message; a * marks the desired revision. Then the changes of desired, newest "
        "first: sequence, from -> to (a rollback marked), when, who (the database role and "
        "client host, or the OS user for SQLite) and why (the message of publish or "
        "rollback). With `status --url A --url B` it answers what is live where. Nothing is "
        "changed.",
        ("trio-supervisor history --config prod.toml --limit 10",
         "trio-supervisor history --config prod.toml --json | jq '.desired'"),
        ((0, "listed"),
         (1, "the control plane could not be reached or refused the read"),
         (2, "bad usage or invalid configuration")),
    ),
    "show": CommandHelp(
        "print one stored revision's document",
        "Prints revision REV as stored, as TOML that publish accepts (defaults written "
        "out), after a header with its time, size, digest and message. Secrets appear as "
        "their references (env:NAME, file:PATH), never as values: nothing is resolved. A "
        "body this build cannot read is printed as stored JSON, with the reason.",
        ("trio-supervisor show 7 --config prod.toml",
         "trio-supervisor show 7 --config prod.toml > revision-7.toml"),
        ((0, "printed"),
         (1, "REV does not exist, or the control plane could not be reached"),
         (2, "bad usage or invalid configuration")),
    ),
    "diff": CommandHelp(
        "show what changes from revision A to revision B (default: the desired one)",
        "Compares two stored revisions alias by alias and key by key: + an entry added, - "
        "removed, ~ one field changed (old -> new), each named by its $.path. Secret "
        "references are compared as references and never resolved. As diff(1) and kubectl "
        "diff: exits 1 when there are changes, 0 when there are none, 2 on any error.",
        ("trio-supervisor diff 5 --config prod.toml",
         "trio-supervisor diff 5 7 --config prod.toml --json | jq '.changes[].path'"),
        ((0, "compared: no changes"),
         (1, "compared: A and B differ"),
         (2, "A or B does not exist or this build cannot read it (the reason label "
             "printed), or the control plane could not be reached")),
    ),
    "rollback": CommandHelp(
        "point desired at an existing revision (no new body)",
        "Makes revision REV desired again, in one statement that succeeds only if REV "
        "still exists with the body that was checked; replicas converge to it as to any "
        "publish (LISTEN fires at commit). REV is first compiled as the daemon would "
        "(secret references standing in for values): a revision this build cannot read, or "
        "would refuse, is not made desired, nor (unless --force) one that a replica's "
        "last refusal names (its /status is read first, when it answers). --message is "
        "stored with the change (see history). Replicas with a cache move their rollback "
        "mark with it. Prints REV as the last line. REV desired already: nothing is "
        "changed or recorded. --dry-run checks all of this and changes nothing.",
        ("trio-supervisor rollback 5 --config prod.toml --message 'team-b broke chat'",
         "trio-supervisor rollback \"$(trio-supervisor history --config prod.toml --json "
         "| jq '.revisions[1].id')\" --config prod.toml"),
        ((0, "desired now points at REV (or did already; --dry-run: would); REV printed "
             "last"),
         (1, "REV does not exist, or the control plane could not be reached"),
         (2, "this build cannot read REV, would refuse it (the reason label printed), "
             "a replica refused it (--force), or the schema is older than this build's (run "
             "db migrate)")),
    ),
    "status": CommandHelp(
        "print the running replica's status report (one line each for several --url)",
        "Fetches GET /status from a running replica's admin API and prints it as a table: "
        "the desired, loaded and active revisions, whether the control plane is up, the "
        "last rejection, the supervised children and the fan-out watchers. The address and "
        "the token come from --config ([admin].listen and [admin].token_file), or from --url "
        "and --token-file. With several --url, one line per replica (desired, active, "
        "source, control plane up, failures, version). Exits 1 when a replica is "
        "unreachable, not ready (no active snapshot) or a child has failed, so it works as "
        "a health check; with --check also unless the active revision is the desired one "
        "and nothing was refused, so it works as a rollout check.",
        ("trio-supervisor status --config /etc/trio-supervisor/prod.toml",
         "trio-supervisor status --check --token-file admin.token "
         "--url http://trio-supervisor-0.trio-supervisor-peers:9464 "
         "--url http://trio-supervisor-1.trio-supervisor-peers:9464"),
        ((0, "the replica is ready and every child is alive (--check: and serves desired)"),
         (1, "unreachable, token refused, not ready, a child has failed, or (--check) the "
             "rollout is not done"),
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
    "completion": CommandHelp(
        "print a shell completion script (bash or zsh)",
        "Prints a completion script for SHELL, generated from this build's own parser, so "
        "every subcommand, option and choice of this version completes, and options that "
        "take a path complete file names. Load it in the shell's start-up file; regenerate "
        "it after an upgrade. Nothing is read or written.",
        ("source <(trio-supervisor completion bash)",
         "trio-supervisor completion zsh > ~/.zsh/trio-supervisor.zsh"),
        ((0, "printed"),
         (2, "an unknown shell")),
    ),
    "follower": CommandHelp(
        "forget a follower's accepted sequence and pinned root (follower reset)",
        "reset: replaces the follower's <[cache].path>.accepted with a reset record, so it "
        "forgets the highest sequence it accepted and the root identity it is pinned to. "
        "A running follower takes its root's next statement at its next poll, without a "
        "restart, and that statement pins the root again. It asks on a terminal; --yes is "
        "needed otherwise. The way to move a follower tree to a new root (README.rst).",
        ("trio-supervisor follower reset --config /etc/trio-supervisor/follower.toml",
         "trio-supervisor follower reset --config follower.toml --yes"),
        ((0, "reset"), (1, "the accepted file cannot be written"),
         (2, "not a follower, no [cache].path, no --yes without a terminal, or not "
             "confirmed")),
    ),
    "keygen": CommandHelp(
        "write a new Ed25519 signing key for the last-known-good cache",
        "Writes a new Ed25519 signing key to --out (mode 0600; an existing file is never "
        "overwritten) and prints its verify key as the last word of the last line, in the "
        "form [cache].trusted_keys accepts. Point [cache].signing_key at the file and add "
        "the verify key to [cache].trusted_keys of every replica that should accept caches "
        "signed with it (docs/operations.md, 'Cache key rotation').",
        ("trio-supervisor keygen --out /etc/trio-supervisor/cache-signing.key",
         "trio-supervisor keygen --out new.key | tail -n1 | awk '{print $NF}'"),
        ((0, "written; the verify key printed last"),
         (1, "the file exists or cannot be written")),
    ),
}


def epilog(help_: CommandHelp, exits_title: str = "exit codes:") -> str:
    """Examples and exit codes, laid out for ``RawDescriptionHelpFormatter``."""
    return "\n".join(["examples:", *(f"  {example}" for example in help_.examples), "",
                      exits_title, *(f"  {code}  {meaning}" for code, meaning in help_.exits)])


def program_epilog() -> str:
    examples = ("trio-supervisor check --config conf/dev.toml",
                "trio-supervisor --config conf/dev.toml          # run the daemon")
    return epilog(CommandHelp("", "", examples, EXIT_CODES),
                  "exit codes (of run; each subcommand's --help lists its own):")
