"""The command line: subcommands and exit codes, nothing else.

The contract: docs/commands.md and docs/exit-codes.md.

Exit codes: 0 clean shutdown; 1 anything else; 2 bad usage or invalid
configuration (or an invalid input file); 3 refused to boot; 4 supervision
gave up. ``python -m supervisor --config PATH`` is ``run``.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import trio

from supervisor import __version__, cli_help, logs
from supervisor.commands import publish, revisions, status
from supervisor.commands.common import (
    EXIT_ERROR,
    EXIT_GAVE_UP,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    admin_base,
    config_path,
    load_config,
)
from supervisor.config import CONFIG_ENV, Config
from supervisor.configchecks import check_files, placeholders
from supervisor.configfile import load
from supervisor.errors import (
    BootRefused,
    ConfigError,
    StartError,
    SupervisionGaveUp,
    SupervisorError,
    UsageError,
    find_leaf,
)
from supervisor.statedirs import creation_problems, make_state_directories

__all__ = ["EXIT_ERROR", "EXIT_GAVE_UP", "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "main"]


_CONFIG_HELP = f"configuration file (TOML); default: ${CONFIG_ENV}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


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
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND",
                                title="commands")

    def command(name: str) -> argparse.ArgumentParser:
        text = cli_help.COMMANDS[name]
        p = sub.add_parser(
            name,
            help=text.summary,
            description=_wrap(text.description),
            epilog=cli_help.epilog(text),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help=_CONFIG_HELP)
        return p

    command("run")
    check = command("check")
    check.add_argument("--strict", action="store_true",
                       help="exit 2 on warnings too (secret files readable by others)")
    db = command("db")
    db.add_argument("action", choices=["migrate", "prune"],
                    help="migrate: create or upgrade the schema (idempotent); prune: delete "
                         "revisions older than the newest --keep N, never the desired one")
    db.add_argument("--keep", type=revisions.count, default=None, metavar="N",
                    help="with prune: how many of the newest revisions to keep")
    db.add_argument("--json", action="store_true",
                    help="with prune: print one JSON document instead of the summary")
    publish.register(command("publish"))
    for name in ("history", "show", "diff", "rollback"):
        revisions.register(name, command(name))
    status.register(command("status"))
    watch = command("watch")
    watch.add_argument("--url", default=None,
                       help="ws://HOST:PORT/v1/stream (default: from [admin].listen of --config)")
    watch.add_argument("--no-reconnect", action="store_true",
                       help="exit when the stream ends (0 on a clean close, 1 when lost)")
    keygen = command("keygen")
    keygen.add_argument("--out", metavar="PATH", required=True,
                        help="where to write the new signing key (mode 0600; must not exist)")
    return parser




# -- commands ------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    config, path = load_config(args)
    logs.configure(config.log.level, config.log.format)
    make_state_directories(config)  # relative paths only: the embedded default's var/
    from supervisor.filemodes import loose_secret_files

    for key, file, why in loose_secret_files(config):
        logs.get_logger("daemon").warning("secret file too open", key=key, path=file, why=why)
    from supervisor.app import run_daemon

    trio.run(run_daemon, config, path)
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    path = config_path(args)
    assert path is not None
    config = load(path)  # check_files reports a missing SQLite directory with the rest
    problems = placeholders(config) + check_files(config) + creation_problems(config)
    if not problems:
        problems = _check_contents(config)
    for key, problem in problems:
        print(f"{path}: {key}: {problem}", file=sys.stderr)
    if problems:
        return EXIT_USAGE
    from supervisor.filemodes import loose_secret_files

    loose = loose_secret_files(config)
    for key, file, why in loose:
        print(f"warning: {path}: {key}: {file} is {why}", file=sys.stderr)
    if loose and getattr(args, "strict", False):
        return EXIT_USAGE
    print(f"{path}: configuration OK")
    return EXIT_OK


def _check_contents(config: Config) -> list[tuple[str, str]]:
    """What the daemon would refuse at start in the files themselves (keys, token)."""
    problems: list[tuple[str, str]] = []
    if config.admin.token_file:
        from supervisor.admin.server import read_token

        try:
            read_token(config.admin.token_file)
        except ConfigError as exc:
            problems.append((exc.path, exc.reason))
    if config.cache.path is not None:
        from supervisor.revision.document import SCHEMA_VERSION
        from supervisor.sinks.lkg import LastKnownGood

        try:
            cache = LastKnownGood(
                config.cache.path,
                signing_key_path=config.cache.signing_key,
                trusted_keys=config.cache.trusted_keys,
                max_schema_version=SCHEMA_VERSION,
            )
        except ConfigError as exc:
            problems.append((exc.path, exc.reason))
        else:
            if config.control_plane.backend == "follower":
                try:
                    cache.refuse_own_key_among(config.control_plane.trusted_keys,
                                               "$.control_plane.trusted_keys")
                except ConfigError as exc:
                    problems.append((exc.path, exc.reason))
            if not cache.signing_key_trusted:
                print("warning: $.cache.signing_key: its verify key is not in "
                      "cache.trusted_keys; this replica would refuse its own cache",
                      file=sys.stderr)
    return problems


def cmd_db(args: argparse.Namespace) -> int:
    if args.action == "prune":
        return revisions.cmd_prune(args)
    if args.keep is not None or args.json:
        raise UsageError("--keep and --json go with db prune")
    config, _ = load_config(args)
    from supervisor.controlplane.factory import open_store
    from supervisor.dsn import redact
    from supervisor.revision.document import SCHEMA_VERSION

    async def migrate() -> None:
        store = open_store(config.control_plane, max_schema_version=SCHEMA_VERSION)
        try:
            await store.migrate()
        finally:
            await store.aclose()

    trio.run(migrate)
    print(f"schema up to date: {redact(config.control_plane.url)}")
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    from supervisor.admin.client import watch_stream

    address, token = admin_base(args)
    url = args.url or f"ws://{address}/v1/stream"

    from supervisor.admin.errors import AdminUnreachable

    async def follow() -> None:
        await watch_stream(url, sys.stdout, token=token, reconnect=not args.no_reconnect)

    try:
        trio.run(follow)
    except AdminUnreachable as exc:
        print(f"watch: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def cmd_keygen(args: argparse.Namespace) -> int:
    from supervisor.sinks.lkg import generate_signing_key

    verify_key = generate_signing_key(args.out)
    print(f"wrote signing key {args.out}")
    print(f"add to [cache].trusted_keys: {verify_key}")
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "check": cmd_check,
    "db": cmd_db,
    "publish": publish.cmd_publish,
    "history": revisions.cmd_history,
    "show": revisions.cmd_show,
    "diff": revisions.cmd_diff,
    "rollback": revisions.cmd_rollback,
    "status": status.cmd_status,
    "watch": cmd_watch,
    "keygen": cmd_keygen,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = COMMANDS[args.command or "run"]
    if command is not cmd_run:
        logs.configure("warning", "console")
    try:
        return command(args)
    except KeyboardInterrupt:
        return EXIT_OK
    except BaseException as exc:  # noqa: BLE001 - mapped to an exit code, never swallowed
        return _report(exc)


def _report(exc: BaseException) -> int:
    found: Any = find_leaf(exc, (ConfigError, UsageError))
    if found is not None:
        label = "configuration error" if isinstance(found, ConfigError) else "error"
        print(f"trio-supervisor: {label}: {found}", file=sys.stderr)
        return EXIT_USAGE
    found = find_leaf(exc, (BootRefused,))
    if found is not None:
        # One log line (JSON in production), not a second plain line beside it.
        # `reason` is the label (as on "revision refused" lines); `refusal` is kept
        # for queries written before it was; the prose is `detail`.
        logs.get_logger("daemon").critical("refused to boot", reason=found.refusal,
                                           refusal=found.refusal, detail=str(found))
        return EXIT_REFUSED
    found = find_leaf(exc, (StartError,))
    if found is not None:
        logs.get_logger("daemon").critical(
            "cannot start", error=str(found), address=getattr(found, "address", None))
        return EXIT_ERROR
    found = find_leaf(exc, (SupervisionGaveUp,))
    if found is not None:
        logs.get_logger("daemon").critical("supervision gave up", child=found.child,
                                           restarts=found.restarts, detail=str(found))
        return EXIT_GAVE_UP
    found = find_leaf(exc, (SupervisorError,))
    if found is not None:
        print(f"trio-supervisor: error: {found}", file=sys.stderr)
        return EXIT_ERROR
    if isinstance(exc, SystemExit):
        return int(exc.code or 0) if isinstance(exc.code, int | None) else EXIT_ERROR
    if find_leaf(exc, (KeyboardInterrupt,)) is not None:
        return EXIT_OK
    logs.get_logger("daemon").critical("unexpected error", error=repr(exc), exc_info=exc)
    return EXIT_ERROR
