"""``history``, ``show``, ``diff``, ``rollback`` and ``db prune`` (docs/commands.md).

Exit codes: 0 done; 1 a revision that does not exist, or the control plane
unreachable or refusing; 2 bad usage, or (``diff``, ``rollback``) a revision
this build cannot read, with the reason label. ``--json`` prints one JSON
document on stdout instead of the table (keys and types held by
``tests/integration/test_lifecycle_cli.py``).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

import msgspec

from supervisor.commands.common import (
    EXIT_OK,
    HTTP_SCHEMES,
    ReferenceResolver,
    add_token_file,
    admin_base,
    admin_url,
    iso,
    load_config,
    with_store,
)
from supervisor.commands.jsonout import print_json
from supervisor.errors import UsageError
from supervisor.texttable import block, cell, table

if TYPE_CHECKING:
    # Also annotations of the --json Structs (encoding never resolves them).
    from supervisor.commands.documents import Change
    from supervisor.controlplane.revisions import DesiredChange, RevisionSummary
    from supervisor.controlplane.store import ControlPlaneStore, LoadedRevision
    from supervisor.revision.document import RevisionDocument

__all__ = ["ChangeRow", "Diff", "History", "Pruned", "RevisionRow", "RolledBack", "Shown",
           "cmd_diff", "cmd_history", "cmd_prune", "cmd_rollback", "cmd_show", "count",
           "register", "sequence_of"]

JSON_HELP = "print one JSON document instead of the table"
#: The largest id a store holds (PostgreSQL bigint; SQLite's integer is as wide).
MAX_REVISION_ID = 2**63 - 1


def _revision_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a revision id: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"revision ids start at 1, got {value}")
    if value > MAX_REVISION_ID:
        raise argparse.ArgumentTypeError(
            f"revision ids end at {MAX_REVISION_ID} (a bigint), got {text}")
    return value


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    if value > MAX_REVISION_ID:
        # Past what SQLite's and PostgreSQL's LIMIT take: the store would fail on it.
        raise argparse.ArgumentTypeError(f"must be at most {MAX_REVISION_ID}, got {text}")
    return value


def register(name: str, parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``name`` (history, show, diff, rollback) to its parser."""
    if name == "history":
        parser.add_argument("--limit", type=count, default=20, metavar="N",
                            help="show the newest N revisions (default 20; 0 for all)")
    elif name == "show":
        parser.add_argument("revision", type=_revision_id, metavar="REV",
                            help="the revision id (see `history`)")
    elif name == "diff":
        parser.add_argument("old", type=_revision_id, metavar="A",
                            help="the revision to compare from")
        parser.add_argument("new", type=_revision_id, metavar="B", nargs="?", default=None,
                            help="the revision to compare to (default: the desired one)")
    elif name == "rollback":
        parser.add_argument("revision", type=_revision_id, metavar="REV",
                            help="the existing revision desired should point at")
        parser.add_argument("--message", metavar="TEXT", default=None,
                            help="why; stored with the change (see `history`)")
        parser.add_argument("--force", action="store_true",
                            help="roll back even to a revision a replica's last refusal names")
        parser.add_argument("--url", action="append", default=None, metavar="URL",
                            type=admin_url(HTTP_SCHEMES),
                            help="a replica whose last refusal is checked first, "
                                 "http://HOST:PORT; repeat for several (default: "
                                 "[admin].listen of --config)")
        add_token_file(parser, "the replicas' admin token")
    if name == "rollback":
        parser.add_argument("--json", action="store_true",
                            help='print one JSON document instead of the lines: {"revision", '
                                 '"previous", "sequence", "message"}')
    else:
        parser.add_argument("--json", action="store_true", help=JSON_HELP)


# -- what --json prints -------------------------------------------------------------


class RevisionRow(msgspec.Struct, kw_only=True):
    """One stored revision (``history``'s ``revisions``; ``show`` adds ``document``)."""

    id: int
    created_at: str | None
    message: str | None
    schema_version: int
    size: int
    body_sha256: str  # its first 12 hex digits
    desired: bool


class Shown(RevisionRow, kw_only=True):
    """``show --json``: the row and the stored document (null when it is not JSON)."""

    document: Any


class ChangeRow(msgspec.Struct, kw_only=True):
    """One change of desired (``history``'s ``changes``, newest first)."""

    sequence: int
    revision_id: int
    changed_at: str | None
    changed_by: str
    message: str | None


class History(msgspec.Struct, kw_only=True):
    desired: int | None
    revisions: list[RevisionRow]
    changes: list[ChangeRow]


class Diff(msgspec.Struct, kw_only=True, rename={"old": "from", "new": "to"}):
    """``diff --json``: ``from``, ``to`` (revision ids) and the changes between them."""

    old: int
    new: int
    changes: list[Change]


class RolledBack(msgspec.Struct, kw_only=True):
    revision: int
    previous: int | None
    sequence: int | None
    message: str | None


class Pruned(msgspec.Struct, kw_only=True):
    deleted: list[int]
    keep: int
    desired: int | None


def _summary_row(row: RevisionSummary, desired: int | None) -> RevisionRow:
    return RevisionRow(id=row.id, created_at=iso(row.created_at), message=row.message,
                       schema_version=row.schema_version, size=row.size,
                       body_sha256=row.body_sha256.hex()[:12], desired=row.id == desired)


# -- history ------------------------------------------------------------------------


def cmd_history(args: argparse.Namespace) -> int:
    config, _ = load_config(args)
    limit = args.limit or None

    async def read(store: ControlPlaneStore) -> tuple[int | None, list[RevisionSummary],
                                                      list[DesiredChange]]:
        desired, rows = await store.history(limit)
        # One more change than shown: the oldest shown change's "from".
        return desired, rows, await store.changes(None if limit is None else limit + 1)

    desired, rows, changes = with_store(config, read)
    shown_changes = changes if limit is None else changes[:limit]
    if args.json:
        print_json(History(desired=desired, revisions=[_summary_row(r, desired) for r in rows],
                           changes=[_change_row(c) for c in shown_changes]), indent=2)
        return EXIT_OK
    if not rows:
        print("no revisions yet; publish one with `trio-supervisor publish`")
        return EXIT_OK
    body = [["*" if r.id == desired else "", r.id, iso(r.created_at), r.schema_version,
             r.size, r.body_sha256.hex()[:12], r.message] for r in rows]
    for line in table(("", "ID", "CREATED", "SCHEMA", "SIZE", "SHA256", "MESSAGE"), body,
                      right=(1, 3, 4)):
        print(line)
    shown = {r.id for r in rows}
    note = f"* desired: revision {desired}" if desired is not None else "nothing is desired"
    if desired is not None and desired not in shown:
        note += " (older than the revisions shown)"
    print(note)
    if shown_changes:
        print()
        print("changes of desired, newest first:")
        for line in table(("SEQ", "CHANGE", "AT", "BY", "MESSAGE"),
                          _change_rows(changes, len(shown_changes)), right=(0,)):
            print(line)
    return EXIT_OK


def _change_row(change: DesiredChange) -> ChangeRow:
    return ChangeRow(sequence=change.sequence, revision_id=change.revision_id,
                     changed_at=iso(change.changed_at), changed_by=change.changed_by,
                     message=change.message)


def _change_rows(changes: list[DesiredChange], shown: int) -> list[list[object]]:
    """One row per change: ``2 -> 1 (rollback)`` when desired moved to an older id."""
    rows: list[list[object]] = []
    for i, change in enumerate(changes[:shown]):
        before = changes[i + 1].revision_id if i + 1 < len(changes) else None
        what = f"{'-' if before is None else before} -> {change.revision_id}"
        if before is not None and change.revision_id < before:
            what += " (rollback)"
        rows.append([change.sequence, what, iso(change.changed_at), change.changed_by,
                     change.message])
    return rows


async def sequence_of(store: ControlPlaneStore, revision: int, after: int | None) -> int | None:
    """The sequence of the change that just made ``revision`` desired: the first change
    naming it after sequence ``after`` (None: unknown, the record went on past it)."""
    found = [c.sequence for c in await store.changes(20)
             if c.revision_id == revision and (after is None or c.sequence > after)]
    return min(found) if found else None


# -- show ---------------------------------------------------------------------------


def _read(config: Any, revision: int) -> tuple[LoadedRevision, int | None]:
    async def read(store: ControlPlaneStore) -> tuple[LoadedRevision, int | None]:
        return await store.revision(revision), await store.desired()

    result: tuple[LoadedRevision, int | None] = with_store(config, read)
    return result


def cmd_show(args: argparse.Namespace) -> int:
    config, _ = load_config(args)
    loaded, desired = _read(config, args.revision)
    try:
        document: Any = json.loads(loaded.body)
    except ValueError:
        document = None
    shown = Shown(id=loaded.id, created_at=iso(loaded.created_at), message=loaded.message,
                  schema_version=loaded.schema_version, size=len(loaded.body),
                  body_sha256=loaded.body_sha256.hex()[:12], desired=loaded.id == desired,
                  document=document)
    if args.json:
        print_json(shown, indent=2)
        return EXIT_OK
    print(f"# revision {loaded.id}{' (desired)' if shown.desired else ''}")
    print(f"# created {shown.created_at}; schema_version {loaded.schema_version}; "
          f"{len(loaded.body)} bytes; sha256 {loaded.body_sha256.hex()[:12]}")
    if loaded.message:
        # cell(): control characters (a stored ANSI escape) never reach the terminal.
        print(f"# message: {' '.join(cell(loaded.message).split())}")
    print(_as_text(loaded))
    return EXIT_OK


def _as_text(loaded: LoadedRevision) -> str:
    """TOML when this build reads the body; otherwise the stored JSON, indented."""
    from supervisor.commands.documents import render_toml
    from supervisor.revision.document import decode_body
    from supervisor.revision.errors import RevisionError

    try:
        return render_toml(decode_body(loaded.body, revision=loaded.id)).rstrip("\n")
    except RevisionError as exc:
        try:
            text = json.dumps(json.loads(loaded.body), indent=2, ensure_ascii=False)
        except ValueError:
            text = loaded.body.decode("utf-8", "replace")
        # As stored, by whoever could write the table: nothing in it drives the terminal.
        return block(f"# this build cannot read it ({exc.reason}): {exc.detail}\n{text}")


async def _readable_row(store: ControlPlaneStore, revision: int,
                        consequence: str = "") -> LoadedRevision:
    """``store.revision(revision)``; a body that fails its digest (``corrupt``) or is over
    ``max_revision_bytes`` (``denied``) is UsageError (exit 2, the label named): this
    build cannot read it, as for an incompatible one. Not found stays exit 1."""
    from supervisor.controlplane.errors import ControlPlaneError, FailureCategory, TooLarge

    try:
        return await store.revision(revision)
    except ControlPlaneError as exc:
        unreadable = isinstance(exc, TooLarge) or exc.category is FailureCategory.CORRUPT
        if not unreadable or exc.revision != revision:
            raise
        detail = str(exc).removeprefix(f"revision {revision}: ")
        raise UsageError(f"revision {revision} cannot be read by this build: {detail} "
                         f"({exc.reason}){consequence}") from exc


# -- diff ---------------------------------------------------------------------------


def readable(loaded: LoadedRevision) -> RevisionDocument:
    """The decoded document, or UsageError (exit 2) naming why this build cannot read it."""
    from supervisor.revision.document import decode_body
    from supervisor.revision.errors import RevisionError

    try:
        return decode_body(loaded.body, revision=loaded.id)
    except RevisionError as exc:
        raise UsageError(
            f"revision {loaded.id} cannot be read by this build: {exc.detail} ({exc.reason})"
        ) from exc


def cmd_diff(args: argparse.Namespace) -> int:
    from supervisor.commands.documents import diff_documents, render_changes

    config, _ = load_config(args)

    async def read(store: ControlPlaneStore) -> tuple[LoadedRevision, LoadedRevision]:
        target = args.new
        if target is None:
            target = await store.desired()
            if target is None:
                raise UsageError("nothing is desired yet: name revision B")
        return await _readable_row(store, args.old), await _readable_row(store, target)

    old, new = with_store(config, read)
    changes = diff_documents(readable(old), readable(new))
    if args.json:
        print_json(Diff(old=old.id, new=new.id, changes=changes), indent=2)
        return EXIT_OK
    print(f"revision {old.id} -> revision {new.id}: {len(changes)} change(s)")
    for line in render_changes(changes):
        print(line)
    return EXIT_OK


# -- rollback -----------------------------------------------------------------------


def cmd_rollback(args: argparse.Namespace) -> int:
    from supervisor.revision.compile import compile_revision
    from supervisor.revision.document import SCHEMA_VERSION
    from supervisor.revision.errors import RevisionError

    config, _ = load_config(args)
    if not args.force:
        _refuse_what_a_replica_refused(args)

    async def roll(store: ControlPlaneStore) -> tuple[int | None, int | None]:
        loaded = await _readable_row(store, args.revision, "; desired was not changed")
        if loaded.schema_version > SCHEMA_VERSION:
            raise UsageError(
                f"revision {loaded.id} has schema_version {loaded.schema_version}; this build "
                f"reads up to {SCHEMA_VERSION} (incompatible); desired was not changed")
        try:
            # As the daemon would compile it, with each secret reference standing in
            # for its value (the secrets live on the replicas' hosts).
            compile_revision(loaded.body, revision=loaded.id, generation=0,
                             resolver=ReferenceResolver(config.revision))
        except RevisionError as exc:
            raise UsageError(f"revision {loaded.id} would be refused: {exc.detail} "
                             f"({exc.reason}); desired was not changed") from exc
        before = await store.observe()
        previous = await store.rollback(loaded.id, loaded.body_sha256, args.message)
        after = None if before is None else before.sequence
        return previous, await sequence_of(store, loaded.id, after)

    previous, sequence = with_store(config, roll)
    if args.json:
        print_json(RolledBack(revision=args.revision, previous=previous, sequence=sequence,
                              message=args.message))
        return EXIT_OK
    why = f": {' '.join(cell(args.message).split())}" if args.message else ""
    at = "" if sequence is None else f" (sequence {sequence})"
    print(f"desired revision {previous} -> {args.revision}{at}{why}")
    print(args.revision)
    return EXIT_OK


def _refuse_what_a_replica_refused(args: argparse.Namespace) -> None:
    """UsageError when a replica's last refusal names the revision to roll back to.

    A replica that cannot be read does not stop the rollback (the control plane
    is the authority; the replicas may be down, which is often why one rolls
    back): a warning says that its refusal could not be checked.
    """
    import sys

    import trio

    from supervisor.admin.client import fetch_status
    from supervisor.admin.errors import AdminUnreachable
    from supervisor.errors import ConfigError

    try:
        # Plain http: rollback has no --ca-file to verify a TLS replica with.
        default, token = admin_base(args, follow_tls=False)
    except (ConfigError, UsageError) as exc:
        if args.url or args.token_file:
            raise
        # The replica's token file is often its own user's alone: an operator who cannot
        # read it can still roll back, told that no replica was asked.
        print(f"warning: cannot check the replica's last refusal: {exc}", file=sys.stderr)
        return
    urls = args.url or [default]
    found: list[str] = []
    unread: list[str] = []

    async def read_all() -> None:
        async def one(url: str) -> None:
            try:
                doc = await fetch_status(url, token, timeout_s=3.0)
            except AdminUnreachable as exc:
                unread.append(f"{exc}")
                return
            revision = doc.get("revision")
            rejection = revision.get("last_rejection") if isinstance(revision, dict) else None
            if isinstance(rejection, dict) and rejection.get("revision") == args.revision:
                found.append(f"{url} refused revision {args.revision} at "
                             f"{cell(rejection.get('at'))}: {cell(rejection.get('reason'))}: "
                             f"{cell(rejection.get('detail'))}")

        async with trio.open_nursery() as nursery:
            for url in urls:
                nursery.start_soon(one, url)

    trio.run(read_all)
    if found:
        raise UsageError("; ".join(sorted(found)) + "; desired was not changed (--force rolls "
                         "back to it anyway)")
    if args.url:
        for why in unread:
            print(f"warning: cannot check the replica's last refusal: {why}", file=sys.stderr)


# -- db prune -----------------------------------------------------------------------


def cmd_prune(args: argparse.Namespace) -> int:
    config, _ = load_config(args)
    if args.keep is None:
        raise UsageError("db prune needs --keep N (how many of the newest revisions to keep)")

    async def prune(store: ControlPlaneStore) -> tuple[list[int], int | None]:
        deleted = await store.prune(args.keep)
        return deleted, await store.desired()

    deleted, desired = with_store(config, prune)
    if args.json:
        print_json(Pruned(deleted=deleted, keep=args.keep, desired=desired))
        return EXIT_OK
    if deleted:
        print(f"deleted {len(deleted)} revision(s): {_ranges(deleted)}")
    else:
        print("nothing to delete")
    if desired is None:
        print(f"kept the newest {args.keep}; nothing is desired")
    else:
        print(f"kept the newest {args.keep} and the desired one ({desired})")
    return EXIT_OK


def _ranges(ids: list[int]) -> str:
    """1, 2, 3, 5 -> "1-3, 5"."""
    parts: list[str] = []
    start = prev = ids[0]
    for rid in [*ids[1:], None]:
        if rid is not None and rid == prev + 1:
            prev = rid
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if rid is not None:
            start = prev = rid
    return ", ".join(parts)
