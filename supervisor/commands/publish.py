"""``publish FILE`` and its modes: ``--dry-run``, ``--resolve-secrets``, ``--wait``.

The user-facing contract (options, ``--json`` keys, exit codes): docs/commands.md.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import ssl
import stat
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

from supervisor.bounds import TooLarge, read_capped
from supervisor.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_REPLICA_REFUSED,
    EXIT_USAGE,
    REPLICA_SCHEMES,
    ReferenceResolver,
    add_flags,
    add_replicas,
    describe_store,
    failure_document,
    gather,
    load_config,
    print_json,
    replica_access,
    sqlite_file,
    with_store,
)
from supervisor.commands.revisions import (
    Change,
    diff_documents,
    number_type,
    readable,
    render_changes,
    sequence_of,
)
from supervisor.config import Config
from supervisor.errors import UsageError
from supervisor.filemodes import describe_mode
from supervisor.reasons import DENIED, INVALID, UNAVAILABLE
from supervisor.revision.document import decode_body
from supervisor.revision.errors import RevisionError

if TYPE_CHECKING:
    # Annotations of the --json Structs too: encoding one never resolves them, so
    # a plain publish does not import the stream client.
    from supervisor.commands.waiting import ReplicaResult
    from supervisor.controlplane.store import LoadedRevision, RevisionAdmin

__all__ = ["DryRun", "Published", "PublishedAndWaited", "cmd_publish", "register"]

DEFAULT_WAIT_S = 60.0
Outcome = Literal["active", "refused", "not_active"]
#: ``--wait``'s outcome and exit code by the verdict that decides it, in the order the
#: verdicts are sorted (the deciding one last).
_OUTCOMES: dict[str, tuple[Outcome, int]] = {
    "active": ("active", EXIT_OK), "superseded": ("not_active", EXIT_ERROR),
    "timeout": ("not_active", EXIT_ERROR), "refused": ("refused", EXIT_REPLICA_REFUSED)}


class Published(msgspec.Struct, kw_only=True):
    """``publish --json``: what is desired now, and whether this publish stored it."""

    ok: bool
    revision: int
    sequence: int | None
    unchanged: bool
    store: str


class PublishedAndWaited(Published, kw_only=True):
    """``publish --wait --json``: also the replicas' verdicts; not active everywhere, the
    deciding replica's ``reason`` and ``detail`` (the failure document's) too."""

    outcome: Outcome
    replicas: list[ReplicaResult]
    reason: str | None = None
    detail: str | None = None


class DryRun(msgspec.Struct, kw_only=True):
    """``publish --dry-run --json``: the changes against the desired revision (None: nothing)."""

    ok: bool
    desired: int | None
    changes: list[Change]


_OUT_OF_RANGE = "must be above 0 and at most 86400, got {text}"
#: Above 0: from the smallest float there is.
_seconds = number_type(float, math.ulp(0.0), 86400, "not a number of seconds: {text!r}",
                       _OUT_OF_RANGE, _OUT_OF_RANGE)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="TOML or JSON revision document")
    parser.add_argument("--message", metavar="TEXT", default=None,
                        help="why this revision exists; stored with it (like a commit message)")
    add_flags(parser, {
        "--dry-run": "validate and compile FILE as the daemon would, secrets resolved here, "
                     "print the changes against the desired revision; store nothing",
        "--resolve-secrets": "also resolve every secret reference in this environment and "
                             "refuse (secret, exit 2) when one cannot be",
        "--wait": "after publishing, wait until every --url replica reports the revision "
                  "active (exit 0) or refused (exit 5)"})
    add_replicas(parser, REPLICA_SCHEMES,
                 "with --wait: a replica's admin URL, http://HOST:PORT; repeat for several "
                 "(default: [admin].listen of --config)",
                 "with --wait: the CA that https/wss replicas' certificates are",
                 "with --wait: the replicas' admin token")
    add_flags(parser, {"--fleet": "with --wait: wait for every replica found by walking the "
                                  "follower tree from the one --url, its root (as status "
                                  "--fleet walks it)"})
    parser.add_argument("--timeout", type=_seconds, default=DEFAULT_WAIT_S, metavar="S",
                        help=f"with --wait: give up after S seconds (exit 1; default "
                             f"{DEFAULT_WAIT_S:g})")
    add_flags(parser, {
        "--force": "store a new revision even when FILE's body is the desired one's",
        "--json": 'print one JSON document on stdout instead of the lines: {"ok", "revision", '
                  '"sequence", "unchanged", "store"}; with --dry-run {"ok", "desired", '
                  '"changes"}; with --wait also "outcome" and "replicas"; refused or failed '
                  '{"ok": false, "reason", "detail"}'})


def _compile(args: argparse.Namespace, config: Config, *, resolve: bool) -> tuple[int, bytes]:
    """(schema_version, canonical body) of FILE, compiled; RevisionError on refusal.

    The daemon's bounds from ``config`` apply, as on a replica. A body over
    ``[control_plane].max_revision_bytes`` is ``denied`` first, as hydration refuses it.
    Resolved secrets obey ``[revision]``'s confinement.
    """
    from supervisor.revision.compile import compile_revision
    from supervisor.revision.files import load_document_file
    from supervisor.revision.secrets import EnvFileResolver

    limit = config.control_plane.max_revision_bytes
    schema_version, body = load_document_file(args.file, read_input(args.file, limit))
    if len(body) > limit:
        raise RevisionError(DENIED, f"the revision is {len(body)} bytes, over "
                                    f"max_revision_bytes ({limit})")
    resolver = (EnvFileResolver.for_daemon(config) if resolve
                else ReferenceResolver(config.revision))
    compile_revision(body, revision=0, generation=0, resolver=resolver)
    return schema_version, body


def read_input(file: str, limit: int) -> bytes:
    """The bytes of ``file`` (``-``: standard input), at most ``limit`` of them.

    Only a regular file is read. It is opened without blocking, so a FIFO with no writer or
    a device is refused at once. Its size is checked before a byte is read: over ``limit``
    is ``denied``. Standard input is read up to ``limit`` and refused past it. Nothing was
    read: UsageError (exit 2) naming the file.
    """
    if file == "-":
        if sys.stdin is None:  # started with it closed (`<&-`)
            raise UsageError("standard input: closed; nothing was stored")
        try:
            return read_capped(sys.stdin.buffer.read, limit, "standard input")
        except TooLarge as exc:
            raise RevisionError(DENIED, f"standard input: more than {limit} bytes "
                                        f"(max_revision_bytes)") from exc
        except OSError as exc:
            raise UsageError(f"standard input: {exc.strerror or exc}; nothing was stored"
                             ) from exc
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        # Not `corrupt`: nothing was read. Say what the shell would.
        raise UsageError(f"{file}: {exc.strerror or exc}; nothing was stored") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{file}: {describe_mode(st.st_mode)}, not a regular file; "
                             f"nothing was stored")
        if st.st_size > limit:
            raise RevisionError(DENIED, f"{file}: {st.st_size} bytes, over "
                                        f"max_revision_bytes ({limit}); nothing was read")
        try:
            return read_capped(partial(os.read, fd), limit, file)  # it may have grown since
        except TooLarge as exc:
            raise RevisionError(DENIED, f"{file}: more than {limit} bytes "
                                        f"(max_revision_bytes)") from exc
    finally:
        os.close(fd)


def cmd_publish(args: argparse.Namespace) -> int:
    """Validate and compile FILE as a replica would, then store it, or only compare (``--dry-run``).

    Every mode compiles the canonical body ``publish`` would store with the daemon's own
    code (:func:`_compile`). So a refusal names the reason label and ``$.path`` a replica
    would log. Plain ``publish``: secret references stand in for values
    (:class:`~.common.ReferenceResolver`). ``--resolve-secrets`` and ``--dry-run``
    resolve them here, as the daemon does (``secret``, exit 2, when one cannot be).

    ``--wait`` then follows each replica's stream (:mod:`supervisor.commands.waiting`). Exit
    0 when all report it active; 5 when any refused it (label and detail on the last line);
    1 when any timed out, was unreachable or serves a newer revision. ``--json`` prints one
    document instead of the lines, same exit codes; a refusal before storing still prints
    its line on stderr.
    """
    if (args.url or args.token_file or args.ca_file or args.fleet) and not args.wait:
        raise UsageError("--url, --token-file, --ca-file and --fleet go with --wait")
    if args.dry_run and args.wait:
        raise UsageError("--dry-run stores nothing: there is nothing to --wait for")
    config, _ = load_config(args)
    try:
        schema_version, body = _compile(args, config,
                                        resolve=args.dry_run or args.resolve_secrets)
    except RevisionError as exc:
        if args.json:
            print_json(failure_document(exc.reason, exc.detail, file=args.file))
        # The label and the $.path on the last line: what a replica would log.
        detail = exc.detail if exc.detail.startswith(args.file) else f"{args.file}: {exc.detail}"
        print(f"refused: {exc.reason}: {detail}; nothing was stored", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        if args.json:
            print_json(failure_document(INVALID, str(exc), file=args.file))
        print(f"trio-supervisor: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        return _dry_run(args, config, body)

    digest = hashlib.sha256(body).digest()

    async def publish(store: RevisionAdmin) -> tuple[int, int | None, bool]:
        """(revision, its change's sequence, unchanged: the desired body already)."""
        from supervisor.controlplane.errors import ControlPlaneError

        try:
            before = await store.observe()
        except ControlPlaneError as exc:
            if exc.retryable:
                raise
            # A pointer this build cannot read (a hand-written id below one, a missing
            # revision): nothing to compare with, and a publish is what repairs it.
            before = None
        if before is not None and before.body_sha256 == digest and not args.force:
            return before.revision, before.sequence, True
        revision = await store.publish(body, schema_version, args.message)
        return revision, await sequence_of(store, revision, before), False

    # Before publishing: a bad token file, URL or --ca-file must not leave a revision nobody
    # waits for, and the follower's imports (a few hundred ms) are not paid between commit
    # and verdict.
    urls, token, ssl_context = replica_access(args) if args.wait else ([], None, None)
    if args.wait:
        from supervisor.commands import waiting  # noqa: F401
    store_name = describe_store(config)
    new_file = _no_control_plane_yet(config)
    revision, sequence, unchanged = with_store(config, publish, create=True, writes=True)
    if new_file:
        _say_a_control_plane_was_created(config, store_name)
    if args.json and not args.wait:
        print_json(Published(ok=True, revision=revision, sequence=sequence,
                             unchanged=unchanged, store=store_name))
        return EXIT_OK
    if not args.json:
        at = "" if sequence is None else f", sequence {sequence}"
        if unchanged:
            print(f"revision {revision} in {store_name} is desired already with this body "
                  f"(sha256 {digest.hex()[:12]}{at}); nothing was stored (--force stores "
                  f"it again)", flush=True)
        else:
            print(f"published revision {revision} to {store_name}{at}", flush=True)
    if not args.wait:
        print(revision)
        return EXIT_OK
    if args.fleet:
        from supervisor.commands.waiting import fleet_urls

        urls = fleet_urls(args, urls, token, ssl_context)
    results = _wait(urls, token, revision, args.timeout, ssl_context)
    last = results[-1]  # the verdict: sorted, a refusal comes last, then anything not active
    outcome, code = _OUTCOMES[last.state]
    if args.json:
        failed = outcome != "active"
        print_json(PublishedAndWaited(
            ok=not failed, revision=revision, sequence=sequence, unchanged=unchanged,
            store=store_name, outcome=outcome, replicas=results,
            reason=(last.reason or UNAVAILABLE) if failed else None,
            detail=f"{last.url}: {last.state}: {last.detail}" if failed else None), indent=2)
        return code
    for result in results:
        if result.state == "active":
            print(f"{result.url}: revision {revision} active")
        elif result.state == "refused":
            print(f"{result.url}: revision {revision} refused ({result.reason})")
        else:
            print(f"{result.url}: {result.state}: {result.detail}")
    if outcome == "refused":
        # The last line, for a pipeline's log: the label and what to fix.
        print(f"refused: {last.reason}: {last.detail}")
    else:
        print(revision if outcome == "active" else f"not active everywhere: revision {revision}")
    return code


# -- --dry-run ----------------------------------------------------------------------


def _no_control_plane_yet(config: Config) -> bool:
    """An SQLite control plane whose file the first ``publish`` has yet to create. A dry run
    then compares against nothing, and does not create it.
    """
    return config.control_plane.backend == "sqlite" and not sqlite_file(config).exists()


def _say_a_control_plane_was_created(config: Config, store_name: str) -> None:
    """A new SQLite control plane is never silent: a relative path made it under this
    working directory, where a daemon started elsewhere never looks."""
    where = (f" ($.control_plane.url {config.control_plane.url} is relative to the working "
             f"directory {Path.cwd()}: a daemon started elsewhere does not read it)"
             if not sqlite_file(config).is_absolute() else "")
    print(f"created a new control plane {store_name}{where}", file=sys.stderr)


def _dry_run(args: argparse.Namespace, config: Config, body: bytes) -> int:
    async def desired(store: RevisionAdmin) -> LoadedRevision | None:
        current = await store.desired()
        return None if current is None else await store.revision(current)

    current = None if _no_control_plane_yet(config) else with_store(config, desired)
    changes = diff_documents(None if current is None else readable(current), decode_body(body))
    against = None if current is None else current.id
    if args.json:
        print_json(DryRun(ok=True, desired=against, changes=changes), indent=2)
        return EXIT_OK
    print(f"{args.file}: compiles; nothing was stored",
          f"changes against {'desired revision ' + str(against) if against else 'nothing'}"
          f" ({len(changes)}):", *render_changes(changes), sep="\n")
    return EXIT_OK


# -- --wait -------------------------------------------------------------------------


def _wait(urls: list[str], token: str | None, revision: int, timeout_s: float,
          ssl_context: ssl.SSLContext | None) -> list[ReplicaResult]:
    """Every replica's verdict, active first (then superseded, timeout, refused; by URL)."""
    from supervisor.commands.waiting import wait_for_revision

    async def one(url: str) -> ReplicaResult:
        return await wait_for_revision(url.rstrip("/"), revision, token, timeout_s, ssl_context)

    return sorted(gather(one, urls), key=lambda r: (list(_OUTCOMES).index(r.state), r.url))
