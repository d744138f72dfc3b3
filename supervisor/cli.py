"""The command line: subcommands and exit codes, nothing else.

The contract: docs/commands.md and docs/exit-codes.md.
``python -m supervisor --config PATH`` is ``run``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NoReturn

import trio

from supervisor import __version__, cli_help, logs
from supervisor.commands import follower, publish, revisions, status
from supervisor.commands.common import (
    EXIT_ERROR,
    EXIT_GAVE_UP,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    REPLICA_SCHEMES,
    add_ca_file,
    add_flags,
    add_token_file,
    add_url,
    config_path,
    failure,
    failure_document,
    load_config,
    print_json,
    probe_schema,
    replica_access,
    require_current_schema,
)
from supervisor.completion import SHELLS
from supervisor.config import CONFIG_ENV, Config
from supervisor.configchecks import check_files, note_problem, placeholders, unconfined_secrets
from supervisor.configfile import all_problems, did_you_mean, env_warnings, load
from supervisor.controlplane.errors import SchemaTooNew
from supervisor.errors import (
    BootRefused,
    ConfigError,
    StartError,
    SupervisionGaveUp,
    SupervisorError,
    UsageError,
    find_leaf,
)
from supervisor.filemodes import loose_secret_files, unsafe_state_places
from supervisor.reasons import INVALID, UNAVAILABLE
from supervisor.statedirs import creation_problems, make_state_directories

__all__ = ["EXIT_ERROR", "EXIT_GAVE_UP", "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "main"]


_CONFIG_HELP = f"configuration file (TOML); default: ${CONFIG_ENV}"


class _BadArguments(Exception):
    """The command line does not parse (said on stderr): :func:`main` exits 2, with the
    ``--json`` failure document when one was asked for."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # `` (did you mean `status`?)`` for argparse's "invalid choice: 'statu'".
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if match is not None:
            message += did_you_mean(match.group(1), re.findall(r"'([^']*)'", match.group(2)))
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise _BadArguments(message)


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=78)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trio-supervisor",
        description=_wrap(cli_help.PROGRAM),
        epilog=cli_help.program_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trio-supervisor {__version__}",
                        help="print the version and exit 0")
    parser.add_argument("--config", metavar="PATH", help=_CONFIG_HELP)
    parser.set_defaults(handler=cmd_run)
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND",
                                title="commands")

    def command(name: str, handler: Callable[[argparse.Namespace], int], *,
                config: bool = True) -> argparse.ArgumentParser:
        text = cli_help.COMMANDS[name]
        p = sub.add_parser(
            name,
            help=text.summary,
            description=_wrap(text.description),
            epilog=cli_help.epilog(text),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if config:
            p.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS,
                           help=_CONFIG_HELP)
        p.set_defaults(handler=handler)
        return p

    command("run", cmd_run)
    check = command("check", cmd_check)
    add_flags(check, {"--strict": "exit 2 on warnings too (secret files readable by others, "
                                  "secret references confined nowhere)"})
    db = command("db", cmd_db)
    db.add_argument("action", choices=["migrate", "prune"],
                    help="migrate: create or upgrade the schema (idempotent); prune: delete "
                         "revisions older than the newest --keep N, never the desired one")
    db.add_argument("--keep", type=revisions.count, default=None, metavar="N",
                    help="with prune: how many of the newest revisions to keep")
    add_flags(db, {"--json": "with prune: print one JSON document instead of the summary",
                   "--dry-run": "with prune: say what would be deleted; delete nothing",
                   "--yes": "with prune: delete without asking (it asks on a terminal, and "
                            "exits 2 without --yes where there is none)"})
    publish.register(command("publish", publish.cmd_publish))
    for name, handler in (("history", revisions.cmd_history), ("show", revisions.cmd_show),
                          ("diff", revisions.cmd_diff), ("rollback", revisions.cmd_rollback)):
        revisions.register(name, command(name, handler))
    status.register(command("status", status.cmd_status))
    follower.register(command("follower", follower.cmd_follower))
    watch = command("watch", cmd_watch)
    add_url(watch, REPLICA_SCHEMES,
            "ws://HOST:PORT/v1/stream (default: from [admin].listen of --config)", many=False)
    add_ca_file(watch, "the CA that a wss replica's certificate is")
    add_token_file(watch)
    add_flags(watch, {"--no-reconnect": "exit when the stream ends (0 on a clean close, 1 when "
                                        "lost)"})
    completion = command("completion", cmd_completion, config=False)
    completion.add_argument("shell", choices=SHELLS, nargs="?",
                            help="the shell whose completion script to print")
    add_flags(completion, {"--revision-ids": "print the newest revision ids of --config's "
                                             "control plane, one a line (what the scripts "
                                             "complete REV with); nothing when it cannot be "
                                             "read"})
    keygen = command("keygen", cmd_keygen, config=False)  # it reads no configuration
    keygen.add_argument("--out", metavar="PATH", required=True,
                        help="where to write the new signing key (mode 0600; must not exist)")
    return parser




# -- commands ------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    config, path = load_config(args)
    logs.configure(config.log.level, config.log.format)
    make_state_directories(config)  # relative paths only: the embedded default's var/
    for key, problem in unsafe_state_places(config):
        raise ConfigError(key, problem)  # the first: `check` lists them all
    for key, file, why in loose_secret_files(config):
        logs.get_logger("daemon").warning("secret file too open", key=key, path=file, why=why)
    for variable, why in env_warnings():
        logs.get_logger("daemon").warning("environment variable not read", variable=variable,
                                          why=why)
    from supervisor.app import run_daemon

    trio.run(run_daemon, config, path)
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    path = config_path(args)
    assert path is not None
    try:
        config = load(path)  # check_files reports a missing SQLite directory with the rest
    except ConfigError:
        for found in all_problems(path):  # every one, not only the first
            print(f"trio-supervisor: configuration error: {found}", file=sys.stderr)
        return EXIT_USAGE
    problems = (placeholders(config) + check_files(config) + creation_problems(config)
                + unsafe_state_places(config))
    warnings: list[tuple[str, str]] = []
    if not problems:
        problems = _check_contents(config, warnings) + _schema_problems(config)
    for key, problem in problems:
        print(f"{path}: {key}: {problem}", file=sys.stderr)
    if problems:
        return EXIT_USAGE
    warnings += [(key, f"{file} is {why}") for key, file, why in loose_secret_files(config)]
    warnings += [("$", why) for _, why in env_warnings()]
    if unconfined_secrets(config):
        warnings.append(("$.revision", "neither secret_env_prefixes nor secret_dirs is set: "
                         "a published revision may reference any environment variable or "
                         "readable file of the replica (its digest is then served)"))
    for key, warning in warnings:
        print(f"warning: {path}: {key}: {warning}", file=sys.stderr)
    if warnings and getattr(args, "strict", False):
        print(f"{path}: {len(warnings)} warning(s); --strict makes each an error",
              file=sys.stderr)
        return EXIT_USAGE
    print(f"{path}: configuration OK")
    return EXIT_OK


def _schema_problems(config: Config) -> list[tuple[str, str]]:
    """A control plane this build has not migrated, or a newer build has; a read-only look.

    An unreachable, slow or empty control plane is no configuration problem: the daemon
    boots from its cache, and ``db migrate`` creates the schema. Only a schema this build
    cannot use is reported, naming ``db migrate`` when that fixes it. Nothing is created.
    """
    try:
        if config.control_plane.backend in ("sqlite", "postgresql"):
            require_current_schema(config, probe_schema(config), may_create=True)
    except (SchemaTooNew, UsageError) as exc:
        return [("$.control_plane.url", str(exc).removesuffix("; nothing was changed"))]
    except Exception as exc:  # noqa: BLE001 - outside trio.run, no Cancelled here
        logs.get_logger("daemon").debug("schema check skipped", error=str(exc))
    return []


def _check_contents(config: Config, warnings: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What the daemon would refuse at start in the files themselves (keys, token); what it
    would accept but regret goes to ``warnings``."""
    problems: list[tuple[str, str]] = []
    accepted = partial(note_problem, problems)
    if config.admin.token_file:
        from supervisor.admin.auth import admin_tokens

        accepted(partial(admin_tokens, config.admin.token_file, config.admin.read_token_file))
    follower = config.control_plane.backend == "follower"
    if follower:
        from supervisor.controlplane.follower import upstream_token

        accepted(partial(upstream_token, config.control_plane))
    if config.cache.path is not None:
        from supervisor.revision.document import SCHEMA_VERSION
        from supervisor.sinks.lkg import LastKnownGood

        cache = accepted(partial(LastKnownGood, config.cache.path,
                                 signing_key_path=config.cache.signing_key,
                                 trusted_keys=config.cache.trusted_keys,
                                 max_schema_version=SCHEMA_VERSION))
        if cache is not None and follower:
            accepted(partial(cache.refuse_own_key_among, config.control_plane.trusted_keys,
                             "$.control_plane.trusted_keys"))
        if cache is not None and not cache.signing_key_trusted:
            warnings.append(("$.cache.signing_key", "its verify key is not in "
                             "cache.trusted_keys; this replica would refuse its own cache"))
    return problems


def cmd_db(args: argparse.Namespace) -> int:
    if args.action == "prune":
        return revisions.cmd_prune(args)
    if args.keep is not None or args.json or args.dry_run or args.yes:
        raise UsageError("--keep, --json, --dry-run and --yes go with db prune")
    config, _ = load_config(args)
    from supervisor.controlplane.factory import open_admin
    from supervisor.controlplane.migrations import Migrated
    from supervisor.dsn import redact
    from supervisor.revision.document import SCHEMA_VERSION

    async def migrate() -> Migrated:
        store = open_admin(config.control_plane, max_schema_version=SCHEMA_VERSION)
        try:
            return await store.migrate()
        finally:
            await store.aclose()

    done = trio.run(migrate)
    print(f"{done.describe()}: {redact(config.control_plane.url)}")
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    from supervisor.admin.client import watch_stream

    [url], token, ssl_context = replica_access(args, "ws", path="/v1/stream")
    trio.run(partial(watch_stream, url, sys.stdout, token=token,
                     reconnect=not args.no_reconnect, ssl_context=ssl_context))
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    from supervisor.completion import revision_ids, script

    if args.revision_ids:
        print(*revision_ids(args), sep="\n")
        return EXIT_OK
    if args.shell is None:
        raise UsageError("completion needs a shell: bash or zsh")
    print(script(_parser(), args.shell), end="")
    return EXIT_OK


def cmd_keygen(args: argparse.Namespace) -> int:
    from supervisor.sinks.lkg import generate_signing_key
    from supervisor.sinks.lkg.keys import parse_verify_key

    verify_key = generate_signing_key(args.out)
    key_id, _ = parse_verify_key(verify_key)
    print(f"wrote signing key {args.out}")
    # "key id X": the form every message naming a key uses (a header names it so).
    print(f"add to [cache].trusted_keys (key id {key_id}): {verify_key}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(words)
    except _BadArguments as bad:
        if "--json" in words:
            _print_failure(INVALID, str(bad))
        return EXIT_USAGE
    command: Callable[[argparse.Namespace], int] = args.handler
    if command is not cmd_run:
        logs.configure("warning", "console")
    try:
        code = command(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then answered below
        return code
    except BaseException as exc:  # noqa: BLE001 - mapped to an exit code, never swallowed
        if find_leaf(exc, (BrokenPipeError,)) is not None:
            return _reader_gone()
        if command not in _STOPPED_BY_CTRL_C and find_leaf(exc, (KeyboardInterrupt,)):
            # Not its answer: a health check or a `publish --wait` cut short did not succeed.
            print("trio-supervisor: interrupted", file=sys.stderr)
            if getattr(args, "json", False):
                _print_failure(UNAVAILABLE, "interrupted")
            return EXIT_ERROR
        if command is cmd_run and _logged_config_error(args, exc):
            return EXIT_USAGE
        code = _unreachable(args.command, exc) or _report(exc)
        if command is revisions.cmd_diff and code == EXIT_ERROR:
            code = EXIT_USAGE  # diff(1): 1 says the revisions differ
        if getattr(args, "json", False) and code != EXIT_OK:
            # The lines went to stderr; a `| jq` pipeline still gets its one document.
            _print_failure(*failure(exc))
        return code


def _unreachable(command: str, exc: BaseException) -> int:
    """``status`` or ``watch`` could not reach (or was refused by) its replica: exit 1,
    said as ``COMMAND: URL: why`` (0: the error is another)."""
    from supervisor.admin.errors import AdminUnreachable

    found = find_leaf(exc, (AdminUnreachable,))
    if found is None:
        return EXIT_OK
    print(f"{command}: {found}", file=sys.stderr)
    return EXIT_ERROR


def _reader_gone() -> int:
    """stdout's reader went away (``| head -1``): exit 1, with nothing more said.

    Whatever is left to write would fail again, and so would Python's own flush at exit.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_ERROR


#: What Ctrl-C ends as its normal stop (exit 0); any other command interrupted exits 1.
_STOPPED_BY_CTRL_C = (cmd_run, cmd_watch)


def _logged_config_error(args: argparse.Namespace, exc: BaseException) -> bool:
    """``run``'s configuration error as a log line of ``[log].format`` (journal, JSON).

    So it looks like every other line of the unit, whenever that format could be read.
    A JSON pipeline or ``journalctl -p err`` then sees why the unit exited 2.
    """
    found = find_leaf(exc, (ConfigError, UsageError))
    if found is None:
        return False
    fmt = _readable_log_format(config_path(args, required=False))
    if fmt is None:
        return False
    logs.configure("info", fmt)
    log = logs.get_logger("daemon")
    if isinstance(found, ConfigError):
        log.critical("invalid configuration", key=found.path, reason=found.reason,
                     source=found.source, detail=str(found))
    else:
        log.critical("invalid configuration", detail=str(found))
    return True


def _readable_log_format(path: str | None) -> str | None:
    """``[log].format`` (or its environment override) when it can be read and is one the
    daemon knows, whatever else is wrong with the configuration; else None."""
    import tomllib

    import msgspec

    from supervisor.config import ENV_PREFIX, LogConfig

    value: object = None
    if path is not None:
        try:
            with open(path, "rb") as file:
                table = tomllib.load(file).get("log")
        except (OSError, ValueError, RecursionError):
            table = None
        value = table.get("format") if isinstance(table, dict) else None
    value = os.environ.get(f"{ENV_PREFIX}LOG__FORMAT", value)
    try:
        return msgspec.convert({"format": value}, LogConfig).format
    except msgspec.ValidationError:
        return None


def _print_failure(reason: str, detail: str) -> None:
    try:
        print_json(failure_document(reason, detail), flush=True)
    except BrokenPipeError:
        _reader_gone()  # the failure was said on stderr already


def _report(exc: BaseException) -> int:
    log = logs.get_logger("daemon")
    # A schema too new is not this build's to read or migrate: a deployment problem, as
    # a bad configuration is.
    found: Any = find_leaf(exc, (ConfigError, UsageError, SchemaTooNew))
    if found is not None:
        label = "configuration error" if isinstance(found, ConfigError) else "error"
        print(f"trio-supervisor: {label}: {found}", file=sys.stderr)
        return EXIT_USAGE
    found = find_leaf(exc, (BootRefused,))
    if found is not None:
        # One log line (JSON in production), not a second plain line beside it.
        # `reason` is the label (as on "revision refused" lines); `refusal` is kept
        # for queries written before it was; the prose is `detail`.
        log.critical("refused to boot", reason=found.refusal, refusal=found.refusal,
                     detail=str(found))
        return EXIT_REFUSED
    found = find_leaf(exc, (StartError,))
    if found is not None:
        log.critical("cannot start", error=str(found), address=getattr(found, "address", None))
        return EXIT_ERROR
    found = find_leaf(exc, (SupervisionGaveUp,))
    if found is not None:
        log.critical("supervision gave up", child=found.child, restarts=found.restarts,
                     detail=str(found))
        return EXIT_GAVE_UP
    found = find_leaf(exc, (SupervisorError,))
    if found is not None:
        print(f"trio-supervisor: error: {found}", file=sys.stderr)
        return EXIT_ERROR
    if isinstance(exc, SystemExit):
        return int(exc.code or 0) if isinstance(exc.code, int | None) else EXIT_ERROR
    if find_leaf(exc, (KeyboardInterrupt,)) is not None:
        return EXIT_OK
    log.critical("unexpected error", error=repr(exc), exc_info=exc)
    return EXIT_ERROR
