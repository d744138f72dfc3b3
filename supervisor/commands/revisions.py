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

from supervisor.commands.common import (
    EXIT_OK,
    ReferenceResolver,
    cell,
    iso,
    load_config,
    table,
    with_store,
)
from supervisor.errors import UsageError

if TYPE_CHECKING:
    from supervisor.controlplane.revisions import RevisionSummary
    from supervisor.controlplane.store import ControlPlaneStore, LoadedRevision
    from supervisor.revision.document import RevisionDocument

__all__ = ["cmd_diff", "cmd_history", "cmd_prune", "cmd_rollback", "cmd_show", "count", "register"]

JSON_HELP = "print one JSON document instead of the table"


def _revision_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a revision id: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"revision ids start at 1, got {value}")
    return value


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
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
                            help="why (printed with the result and recorded with the "
                                 "change of the desired pointer)")
    if name == "rollback":
        parser.add_argument("--json", action="store_true",
                            help='print one JSON document instead of the lines: {"revision", '
                                 '"previous", "message"}')
    else:
        parser.add_argument("--json", action="store_true", help=JSON_HELP)


def _summary_json(row: RevisionSummary, desired: int | None) -> dict[str, Any]:
    return {"id": row.id, "created_at": iso(row.created_at), "message": row.message,
            "schema_version": row.schema_version, "size": row.size,
            "body_sha256": row.body_sha256.hex()[:12], "desired": row.id == desired}


# -- history ------------------------------------------------------------------------


def cmd_history(args: argparse.Namespace) -> int:
    config, _ = load_config(args)
    limit = args.limit or None

    async def read(store: ControlPlaneStore) -> tuple[int | None, list[RevisionSummary]]:
        return await store.history(limit)

    desired, rows = with_store(config, read)
    if args.json:
        print(json.dumps({"desired": desired,
                          "revisions": [_summary_json(r, desired) for r in rows]}, indent=2))
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
    return EXIT_OK


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
    header = {"id": loaded.id, "created_at": iso(loaded.created_at), "message": loaded.message,
              "schema_version": loaded.schema_version, "size": len(loaded.body),
              "body_sha256": loaded.body_sha256.hex()[:12], "desired": loaded.id == desired}
    if args.json:
        print(json.dumps({**header, "document": document}, indent=2))
        return EXIT_OK
    print(f"# revision {loaded.id}{' (desired)' if header['desired'] else ''}")
    print(f"# created {header['created_at']}; schema_version {loaded.schema_version}; "
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
        return f"# this build cannot read it ({exc.reason}): {exc.detail}\n{text}"


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
        print(json.dumps({"from": old.id, "to": new.id,
                          "changes": [c.to_json() for c in changes]}, indent=2))
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

    async def roll(store: ControlPlaneStore) -> int | None:
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
        return await store.rollback(loaded.id, loaded.body_sha256, args.message)

    previous = with_store(config, roll)
    if args.json:
        print(json.dumps({"revision": args.revision, "previous": previous,
                          "message": args.message}))
        return EXIT_OK
    why = f": {' '.join(cell(args.message).split())}" if args.message else ""
    print(f"desired revision {previous} -> {args.revision}{why}")
    print(args.revision)
    return EXIT_OK


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
        print(json.dumps({"deleted": deleted, "keep": args.keep, "desired": desired}))
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
