"""``trio-supervisor follower reset``: forget a follower's accepted sequence and pinned root."""

from __future__ import annotations

import argparse
import sys

from supervisor.commands.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, add_flags, load_config
from supervisor.errors import ConfigError

__all__ = ["cmd_follower", "register"]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["reset"],
                        help="reset: forget the accepted sequence and the pinned root")
    add_flags(parser, {"--yes": "reset without asking (needed when stdin is not a terminal)"})


def cmd_follower(args: argparse.Namespace) -> int:
    """Replace ``<[cache].path>.accepted`` with a reset record (:func:`~.accepted.write_reset`).

    It moves a follower to a new root. It is also the way out of a sequence the root will
    never reach again (its database restored from before a rollback). A running follower
    notices at its next poll and takes its root's next statement, which pins that root
    again. A follower started later does not restore them from the statement it forwards.
    Asks on a terminal; elsewhere ``--yes`` is needed (exit 2 without).
    """
    from supervisor.sinks.lkg.accepted import ACCEPTED_SUFFIX, AcceptedStatements, write_reset

    config, _ = load_config(args)
    if config.control_plane.backend != "follower":
        raise ConfigError("$.control_plane.url", "this replica is no follower: it has no "
                          "accepted sequence to reset")
    if config.cache.path is None:
        raise ConfigError("$.cache.path", "unset: the follower keeps its accepted sequence "
                          "in memory only, and a restart forgets it")
    path = config.cache.path + ACCEPTED_SUFFIX
    try:
        held = AcceptedStatements(path).highest
    except ConfigError:
        held = None  # unreadable: the reset replaces it all the same
    what = ("nothing accepted yet" if held is None else
            f"sequence {held.sequence} (revision {held.revision}) of root {held.root!r}")
    if not args.yes:
        if not sys.stdin.isatty():
            print(f"trio-supervisor: follower reset would forget {what} ({path}); "
                  "pass --yes to do so without a terminal", file=sys.stderr)
            return EXIT_USAGE
        answer = input(f"Forget {what} ({path})? The next statement of the root this "
                       "follower polls is then accepted, whatever its sequence. [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("trio-supervisor: nothing reset", file=sys.stderr)
            return EXIT_USAGE
    try:
        write_reset(path)
    except OSError as exc:
        print(f"trio-supervisor: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{path}: forgot {what}; the root's next statement sets them again")
    return EXIT_OK
