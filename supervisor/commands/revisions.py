"""``history``, ``show``, ``diff``, ``rollback`` and ``db prune``, and revisions for people.

Exit codes and ``--json`` keys: docs/commands.md; tests/integration/test_lifecycle_cli.py holds
the keys. The renderings see decoded documents only: a secret is its reference, never its value.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from itertools import groupby
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec

from supervisor.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    HTTP_SCHEMES,
    ReferenceResolver,
    add_flags,
    add_replicas,
    iso,
    load_config,
    print_json,
    replica_access,
    replica_statuses,
    with_store,
)
from supervisor.errors import UsageError
from supervisor.revision.document import (
    SCHEMA_VERSION,
    RevisionDocument,
    decode_body,
    member_path,
)
from supervisor.revision.errors import RevisionError
from supervisor.texttable import block, cell, table

if TYPE_CHECKING:
    # Also annotations of the --json Structs (encoding never resolves them).
    from supervisor.controlplane.revisions import DesiredChange, RevisionSummary
    from supervisor.controlplane.store import LoadedRevision, RevisionAdmin, RevisionPointer

__all__ = ["Change", "ChangeRow", "Diff", "History", "Pruned", "RevisionRow", "RolledBack",
           "Shown", "cmd_diff", "cmd_history", "cmd_prune", "cmd_rollback", "cmd_show", "count",
           "diff_documents", "number_type", "register", "render_changes", "render_toml",
           "sequence_of"]

#: The largest id a store holds (PostgreSQL bigint; SQLite's integer is as wide).
MAX_REVISION_ID = 2**63 - 1

N = TypeVar("N", int, float)


def number_type(kind: Callable[[str], N], low: N, high: N, not_one: str, below: str,
                above: str) -> Callable[[str], N]:
    """The argparse type of a ``kind`` from ``low`` to ``high``; each refusal's words
    formatted with ``text``, ``value`` and ``top`` (``high``)."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(not_one.format(text=text)) from None
        if not low <= value <= high:
            words = below if value < low else above
            raise argparse.ArgumentTypeError(words.format(text=text, value=value, top=high))
        return value

    return parse


_revision_id = number_type(int, 1, MAX_REVISION_ID, "not a revision id: {text!r}",
                           "revision ids start at 1, got {value}",
                           "revision ids end at {top} (a bigint), got {text}")
#: A count of revisions: past MAX_REVISION_ID is past what SQLite's and PostgreSQL's
#: LIMIT take, where the store would fail on it.
count = number_type(int, 0, MAX_REVISION_ID, "not a number: {text!r}",
                    "must be 0 or more, got {value}", "must be at most {top}, got {text}")


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
        add_flags(parser, {
            "--force": "roll back even to a revision a replica's last refusal names",
            "--dry-run": "check everything a rollback checks, say what it would change, and "
                         "change nothing"})
        add_replicas(parser, HTTP_SCHEMES,
                     "a replica whose last refusal is checked first, http://HOST:PORT; repeat "
                     "for several (default: [admin].listen of --config)",
                     "the CA that https replicas' certificates are", "the replicas' admin token")
    parser.add_argument("--json", action="store_true", help=(
        'print one JSON document instead of the lines: {"revision", "previous", "sequence", '
        '"message"}' if name == "rollback" else "print one JSON document instead of the table"))


# -- what --json prints -------------------------------------------------------------


class RevisionRow(msgspec.Struct, kw_only=True):
    """One stored revision (``history``'s ``revisions``; ``show`` adds ``document``)."""

    id: int
    created_at: str | None
    message: str | None
    schema_version: int
    size: int
    body_sha256: str  # all 64 hex digits (the tables show the first 12)
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


class RolledBack(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``rollback --json``; ``unchanged`` when it was desired already, ``dry_run`` when
    nothing was changed on purpose (both only when true)."""

    revision: int
    previous: int | None
    sequence: int | None
    message: str | None
    unchanged: bool = False
    dry_run: bool = False


class Pruned(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``db prune --json``; with ``--dry-run``, ``deleted`` is what would be and
    ``dry_run`` is true."""

    deleted: list[int]
    keep: int
    desired: int | None
    dry_run: bool = False


def _row_fields(row: RevisionSummary | LoadedRevision, size: int,
                desired: int | None) -> dict[str, Any]:
    """A stored revision's :class:`RevisionRow` fields."""
    return {"id": row.id, "created_at": iso(row.created_at), "message": row.message,
            "schema_version": row.schema_version, "size": size,
            "body_sha256": row.body_sha256.hex(), "desired": row.id == desired}


# -- history ------------------------------------------------------------------------


def cmd_history(args: argparse.Namespace) -> int:
    config, _ = load_config(args)
    limit = args.limit or None

    async def read(store: RevisionAdmin) -> tuple[int | None, list[RevisionSummary],
                                                      list[DesiredChange]]:
        desired, rows = await store.history(limit)
        # One more change than shown: the oldest shown change's "from".
        return desired, rows, await store.changes(None if limit is None else limit + 1)

    desired, summaries, desired_changes = with_store(config, read)
    rows = [RevisionRow(**_row_fields(r, r.size, desired)) for r in summaries]
    changes = [ChangeRow(sequence=c.sequence, revision_id=c.revision_id,
                         changed_at=iso(c.changed_at), changed_by=c.changed_by,
                         message=c.message) for c in desired_changes]
    shown_changes = changes if limit is None else changes[:limit]
    if args.json:
        print_json(History(desired=desired, revisions=rows, changes=shown_changes), indent=2)
        return EXIT_OK
    if not rows:
        print("no revisions yet; publish one with `trio-supervisor publish`")
        return EXIT_OK
    body = [["*" if r.desired else "", r.id, r.created_at, r.schema_version, r.size,
             r.body_sha256[:12], r.message] for r in rows]
    print(*table(("", "ID", "CREATED", "SCHEMA", "SIZE", "SHA256", "MESSAGE"), body,
                 right=(1, 3, 4)), sep="\n")
    note = f"* desired: revision {desired}" if desired is not None else "nothing is desired"
    if desired is not None and desired not in {r.id for r in rows}:
        note += " (older than the revisions shown)"
    print(note)
    if shown_changes:
        print("", "changes of desired, newest first:", *table(
            ("SEQ", "CHANGE", "AT", "BY", "MESSAGE"), _change_rows(changes, len(shown_changes)),
            right=(0,)), sep="\n")
    return EXIT_OK


def _change_rows(changes: list[ChangeRow], shown: int) -> list[list[object]]:
    """One row per change: ``2 -> 1 (rollback)`` when desired moved to an older id."""
    rows: list[list[object]] = []
    for i, change in enumerate(changes[:shown]):
        before = changes[i + 1].revision_id if i + 1 < len(changes) else None
        what = f"{'-' if before is None else before} -> {change.revision_id}"
        if before is not None and change.revision_id < before:
            what += " (rollback)"
        rows.append([change.sequence, what, change.changed_at, change.changed_by,
                     change.message])
    return rows


async def sequence_of(store: RevisionAdmin, revision: int,
                      before: RevisionPointer | None) -> int | None:
    """The sequence of the change that just made ``revision`` desired: the first change
    naming it after ``before`` (what was desired before it; None: unknown, the record went
    on past it)."""
    after = None if before is None else before.sequence
    found = [c.sequence for c in await store.changes(20)
             if c.revision_id == revision and (after is None or c.sequence > after)]
    return min(found) if found else None


# -- show ---------------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    config, _ = load_config(args)

    async def read(store: RevisionAdmin) -> tuple[LoadedRevision, int | None]:
        return await store.revision(args.revision), await store.desired()

    loaded, desired = with_store(config, read)
    try:
        document: Any = json.loads(loaded.body)
    except ValueError:
        document = None
    shown = Shown(**_row_fields(loaded, len(loaded.body), desired), document=document)
    if args.json:
        print_json(shown, indent=2)
        return EXIT_OK
    print(f"# revision {loaded.id}{' (desired)' if shown.desired else ''}")
    print(f"# created {shown.created_at}; schema_version {loaded.schema_version}; "
          f"{shown.size} bytes; sha256 {shown.body_sha256}")
    if loaded.message:
        # cell(): control characters (a stored ANSI escape) never reach the terminal.
        print(f"# message: {' '.join(cell(loaded.message).split())}")
    print(_as_text(loaded))
    return EXIT_OK


def _as_text(loaded: LoadedRevision) -> str:
    """TOML when this build reads the body; otherwise the stored JSON, indented."""
    try:
        return render_toml(decode_body(loaded.body, revision=loaded.id)).rstrip("\n")
    except RevisionError as exc:
        try:
            text = json.dumps(json.loads(loaded.body), indent=2, ensure_ascii=False)
        except ValueError:
            text = loaded.body.decode("utf-8", "replace")
        # As stored, by whoever could write the table: nothing in it drives the terminal.
        return block(f"# this build cannot read it ({exc.reason}): {exc.detail}\n{text}")


async def _readable_row(store: RevisionAdmin, revision: int,
                        consequence: str = "") -> LoadedRevision:
    """``store.revision(revision)``, or UsageError (exit 2) when this build cannot read it.

    A body that fails its digest (``corrupt``) or exceeds ``max_revision_bytes``
    (``denied``) is treated as an incompatible one, the label named. Not found stays exit 1.
    """
    from supervisor.controlplane.errors import ControlPlaneError, FailureCategory, TooLarge

    try:
        return await store.revision(revision)
    except ControlPlaneError as exc:
        unreadable = isinstance(exc, TooLarge) or exc.category is FailureCategory.CORRUPT
        if not unreadable or exc.revision != revision:
            raise
        detail = str(exc).removeprefix(f"revision {revision}: ")
        raise _unreadable(revision, detail, exc.reason, consequence) from exc


def _unreadable(revision: int, detail: str, reason: str, consequence: str = "") -> UsageError:
    return UsageError(f"revision {revision} cannot be read by this build: {detail} ({reason})"
                      f"{consequence}")


# -- diff ---------------------------------------------------------------------------


def readable(loaded: LoadedRevision) -> RevisionDocument:
    """The decoded document, or UsageError (exit 2) naming why this build cannot read it."""
    try:
        return decode_body(loaded.body, revision=loaded.id)
    except RevisionError as exc:
        raise _unreadable(loaded.id, exc.detail, exc.reason) from exc


def cmd_diff(args: argparse.Namespace) -> int:
    config, _ = load_config(args)

    async def read(store: RevisionAdmin) -> tuple[LoadedRevision, LoadedRevision]:
        target = args.new
        if target is None:
            target = await store.desired()
            if target is None:
                raise UsageError("nothing is desired yet: name revision B")
        return await _readable_row(store, args.old), await _readable_row(store, target)

    old, new = with_store(config, read)
    changes = diff_documents(readable(old), readable(new))
    # diff(1) and kubectl diff: 1 when they differ (any error is 2: cli.main).
    code = EXIT_DIFFERENT if changes else EXIT_OK
    if args.json:
        print_json(Diff(old=old.id, new=new.id, changes=changes), indent=2)
        return code
    print(f"revision {old.id} -> revision {new.id}: {len(changes)} change(s)",
          *render_changes(changes), sep="\n")
    return code


#: ``diff``: the two revisions differ.
EXIT_DIFFERENT = 1


# -- rollback -----------------------------------------------------------------------


def cmd_rollback(args: argparse.Namespace) -> int:
    from supervisor.revision.compile import compile_revision

    config, _ = load_config(args)
    rejections = [] if args.force else _replica_rejections(args)

    async def roll(store: RevisionAdmin) -> tuple[int | None, int | None, bool]:
        loaded = await _readable_row(store, args.revision, "; desired was not changed")
        await _refuse_what_a_replica_refused(store, loaded, rejections)
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
        if before is not None and before.revision == loaded.id:
            return loaded.id, before.sequence, True  # no `2 -> 2` change on the record
        if args.dry_run:
            return None if before is None else before.revision, None, False
        previous = await store.rollback(loaded.id, loaded.body_sha256, args.message)
        return previous, await sequence_of(store, loaded.id, before), False

    previous, sequence, unchanged = with_store(config, roll, writes=not args.dry_run)
    if args.json:
        print_json(RolledBack(revision=args.revision, previous=previous, sequence=sequence,
                              message=None if unchanged or args.dry_run else args.message,
                              unchanged=unchanged, dry_run=args.dry_run))
        return EXIT_OK
    at = "" if sequence is None else f" (sequence {sequence})"
    if unchanged:
        print(f"revision {args.revision} is already desired{at}; nothing was changed")
        return EXIT_OK
    if args.dry_run:
        print(f"would point desired revision {previous} -> {args.revision}; nothing was "
              f"changed (--dry-run)")
        return EXIT_OK
    why = f": {' '.join(cell(args.message).split())}" if args.message else ""
    print(f"desired revision {previous} -> {args.revision}{at}{why}")
    print(args.revision)
    return EXIT_OK


def _replica_rejections(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """Each replica's last refusal, ``(url, last_rejection)``, for the rollback's check.

    A replica that cannot be read does not stop the rollback. The control plane is the
    authority, and replicas may be down: often why one rolls back. A warning says its
    refusal could not be checked. No warning when nothing listens at the configured
    address and no ``--url`` was given.
    """
    from supervisor.admin.errors import AdminUnreachable
    from supervisor.errors import ConfigError, innermost

    try:
        urls, token, ssl_context = replica_access(args)
    except (ConfigError, UsageError) as exc:
        if args.url or args.token_file or args.ca_file:
            raise
        # The replica's token file is often its own user's alone: an operator who cannot
        # read it can still roll back, told that no replica was asked.
        print(f"warning: cannot check the replica's last refusal: {exc}", file=sys.stderr)
        return []
    found: list[tuple[str, dict[str, Any]]] = []
    for url, doc in zip(urls, replica_statuses(urls, token, ssl_context, timeout_s=3.0),
                        strict=True):
        if isinstance(doc, AdminUnreachable):
            # Nothing listening where --config points is the usual case on an operator's
            # machine; a replica that answered but could not be read (its certificate, its
            # token) or one named with --url is worth the warning.
            if args.url or not isinstance(innermost(doc), ConnectionRefusedError):
                print(f"warning: cannot check the replica's last refusal: {doc}",
                      file=sys.stderr)
            continue
        revision = doc.get("revision")
        rejection = revision.get("last_rejection") if isinstance(revision, dict) else None
        if isinstance(rejection, dict) and isinstance(rejection.get("revision"), int):
            found.append((url, rejection))
    return found


async def _refuse_what_a_replica_refused(store: RevisionAdmin, target: LoadedRevision,
                                         rejections: list[tuple[str, dict[str, Any]]]) -> None:
    """UsageError when a replica last refused ``target``'s body: that revision, or another with
    the same body. A refusal is about content, not an id.
    """
    from supervisor.controlplane.errors import ControlPlaneError

    found = []
    for url, rejection in rejections:
        refused = rejection["revision"]
        same = ""
        if refused != target.id:
            try:
                other = await store.revision(refused)
            except ControlPlaneError:
                continue  # pruned or unreadable: not this body as far as can be known
            if other.body_sha256 != target.body_sha256:
                continue
            same = f" (the same body as revision {target.id})"
        found.append(f"{url} refused revision {refused}{same} at "
                     f"{cell(rejection.get('at'))}: {cell(rejection.get('reason'))}: "
                     f"{cell(rejection.get('detail'))}")
    if found:
        raise UsageError("; ".join(sorted(found)) + "; desired was not changed (--force rolls "
                         "back to it anyway)")


# -- db prune -----------------------------------------------------------------------


def cmd_prune(args: argparse.Namespace) -> int:
    config, _ = load_config(args)
    if args.keep is None:
        raise UsageError("db prune needs --keep N (how many of the newest revisions to keep)")

    async def plan(store: RevisionAdmin) -> tuple[list[int], int | None]:
        """What a prune would delete now: all but the newest ``keep`` and the desired."""
        desired, rows = await store.history(None)
        newest_first = sorted((r.id for r in rows), reverse=True)
        return sorted(i for i in newest_first[args.keep:] if i != desired), desired

    async def prune(store: RevisionAdmin) -> tuple[list[int], int | None]:
        deleted = await store.prune(args.keep)
        return deleted, await store.desired()

    if args.dry_run or not args.yes:
        # The plan of a write looks at the schema first: opening a SQLite store migrates it.
        doomed, desired = with_store(config, plan, writes=not args.dry_run)
        if args.dry_run:
            return _pruned(args, doomed, desired, dry_run=True)
        if doomed and not _confirmed(f"delete {len(doomed)} revision(s): {_ranges(doomed)}"):
            return EXIT_ERROR
    deleted, desired = with_store(config, prune, writes=True)
    return _pruned(args, deleted, desired, dry_run=False)


def _confirmed(what: str) -> bool:
    """The operator's yes on a terminal; UsageError (exit 2) where there is none to ask."""
    if not sys.stdin.isatty():
        raise UsageError(f"db prune would {what}; pass --yes to delete without a terminal to "
                         f"ask on (--dry-run lists them)")
    print(f"{what}? [y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() in ("y", "yes"):
        return True
    print("nothing was deleted", file=sys.stderr)
    return False


def _pruned(args: argparse.Namespace, deleted: list[int], desired: int | None, *,
            dry_run: bool) -> int:
    if args.json:
        print_json(Pruned(deleted=deleted, keep=args.keep, desired=desired, dry_run=dry_run))
        return EXIT_OK
    if deleted and dry_run:
        print(f"would delete {len(deleted)} revision(s): {_ranges(deleted)}; nothing was "
              f"deleted (--dry-run)")
    elif deleted:
        print(f"deleted {len(deleted)} revision(s): {_ranges(deleted)}")
    else:
        print("nothing to delete")
    kept = "would keep" if dry_run else "kept"
    if desired is None:
        print(f"{kept} the newest {args.keep}; nothing is desired")
    else:
        print(f"{kept} the newest {args.keep} and the desired one ({desired})")
    return EXIT_OK


def _ranges(ids: list[int]) -> str:
    """1, 2, 3, 5 -> "1-3, 5"."""
    runs = [[rid for _, rid in run] for _, run in groupby(enumerate(ids), lambda p: p[1] - p[0])]
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


# -- documents for people ----------------------------------------------------------------


Op = Literal["added", "removed", "changed"]
_SYMBOL = {"added": "+", "removed": "-", "changed": "~"}


class Change(msgspec.Struct, frozen=True, rename={"old": "from", "new": "to"}):
    """One difference: an alias or key added or removed (its whole entry), or one field changed.

    In JSON (``--json``'s ``changes``): ``op``, ``path``, ``from``, ``to``.
    """

    op: Op
    path: str
    old: Any = None
    new: Any = None


def _entries(doc: RevisionDocument | None, section: str) -> dict[str, dict[str, Any]]:
    if doc is None:
        return {}
    table = msgspec.to_builtins(getattr(doc, section))
    assert isinstance(table, dict)
    return table


def diff_documents(old: RevisionDocument | None, new: RevisionDocument) -> list[Change]:
    """What changes from ``old`` (None: nothing) to ``new``, sorted by section and name."""
    changes: list[Change] = []
    if old is not None and old.schema_version != new.schema_version:
        changes.append(Change("changed", "$.schema_version", old.schema_version,
                              new.schema_version))
    for section in ("aliases", "keys"):
        before, after = _entries(old, section), _entries(new, section)
        for name in sorted(before.keys() | after.keys()):
            path = member_path(f"$.{section}", name)
            if name not in before:
                changes.append(Change("added", path, None, after[name]))
            elif name not in after:
                changes.append(Change("removed", path, before[name], None))
            else:
                for field in sorted(before[name].keys() | after[name].keys()):
                    was, now = before[name].get(field), after[name].get(field)
                    if was != now:
                        changes.append(Change("changed", f"{path}.{field}", was, now))
    return changes


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def render_changes(changes: list[Change]) -> list[str]:
    """One line per change: ``+``/``-`` a whole entry, ``~`` one field ``old -> new``."""
    if not changes:
        return ["  no changes"]
    lines = []
    for change in changes:
        symbol = _SYMBOL[change.op]
        if change.op == "changed":
            lines.append(f"  {symbol} {change.path}: {_value(change.old)} -> "
                         f"{_value(change.new)}")
        else:
            entry = change.new if change.op == "added" else change.old
            lines.append(f"  {symbol} {change.path}: {_value(entry)}")
    return lines


def _toml_key(name: str) -> str:
    path = member_path("", name)
    # member_path quotes exactly the names TOML would need quoted too (as a JSON
    # string, which is a valid TOML basic string for the characters names may hold).
    return path[1:] if path.startswith(".") else path[1:-1]


def render_toml(doc: RevisionDocument) -> str:
    """The document as the TOML ``publish`` accepts, defaults written out."""
    lines = [f"schema_version = {doc.schema_version}"]
    for name, alias in sorted(doc.aliases.items()):
        lines += ["", f"[aliases.{_toml_key(name)}]",
                  f"upstream = {_value(alias.upstream)}",
                  f"timeout_s = {alias.timeout_s!r}",
                  f"retries = {alias.retries}"]
    for name, key in sorted(doc.keys.items()):
        lines += ["", f"[keys.{_toml_key(name)}]",
                  f"secret = {_value(key.secret)}",
                  f"aliases = {_value(list(key.aliases))}"]
    return "\n".join(lines) + "\n"
