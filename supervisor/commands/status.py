"""``status``: one replica's report as a table, or one line per replica for several ``--url``."""

from __future__ import annotations

import argparse
import ssl
import sys
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from supervisor.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    HTTP_SCHEMES,
    add_flags,
    add_replicas,
    config_path,
    failure,
    failure_document,
    print_json,
    replica_access,
    replica_statuses,
)
from supervisor.errors import UsageError
from supervisor.texttable import cell, table

if TYPE_CHECKING:
    from supervisor.commands.fleet import FleetRow

__all__ = ["Check", "FleetAnswer", "cmd_status", "fleet_rows", "register", "rollout_problems"]


class Check(msgspec.Struct):
    """``status --check --json``: the verdict, beside the document it judges."""

    ok: bool
    why: str


def rollout_problems(doc: dict[str, Any]) -> list[str]:
    """Why a replica has not finished the rollout of the desired revision; empty when done.

    A refusal counts when it names the desired revision, or when the last attempt
    failed. (A replica may refuse it, keep the one before, and show active == desired
    only after a rollback to it.) A refusal of a revision rolled back from does not count.
    """
    rev = doc.get("revision")
    if not isinstance(rev, dict):
        return ["no revision report"]
    desired, active = rev.get("desired"), rev.get("active")
    problems = []
    if desired is None:
        problems.append("desired revision unknown")
    elif active != desired:
        problems.append(f"active revision {cell(active)}, desired {cell(desired)}")
    rejection = rev.get("last_rejection")
    if isinstance(rejection, dict):
        named = rejection.get("revision")
        failing = bool(rev.get("consecutive_failures"))
        if named == desired or failing:
            problems.append(f"refused revision {cell(named)} ({cell(rejection.get('reason'))})")
    return problems


def register(parser: argparse.ArgumentParser) -> None:
    add_replicas(parser, HTTP_SCHEMES,
                 "admin API base URL, http://HOST:PORT (default: [admin].listen of --config, "
                 "else http://127.0.0.1:9464); repeat for several replicas: one line each",
                 "the CA that an https replica's certificate is")
    add_flags(parser, {
        "--check": "a rollout check: exit 1 also unless every replica's active revision is the "
                   "desired one and nothing was refused",
        "--fleet": "walk the follower tree from the one --url (its root) through each "
                   "replica's GET /v1/followers: one row a replica (depth, URL, sequence, "
                   "state, reason, lag); exit 1 unless every one is converged. Statements are "
                   "verified with --config's trusted keys",
        "--json": 'print the raw /status JSON document instead of the table (with --check '
                  'also "check": {"ok", "why"}; several --url: an object keyed by URL, '
                  '{"ok": false, "reason", "detail"} for one that did not answer)'})


def cmd_status(args: argparse.Namespace) -> int:
    """One replica's report (unreachable: AdminUnreachable, exit 1), or one row each.

    Exit 1 when any replica is unreachable, not ready (no active snapshot) or has a
    failed child: a health check over a fleet. With ``--check`` also when a rollout
    is not done (:func:`rollout_problems`).

    A document is read as the JSON it is, not decoded into this build's
    :class:`~supervisor.status_doc.StatusDocument`. During a rollout replicas run other
    builds, with keys this one lacks or lacking keys it has. ``--json`` prints each as sent.
    """
    from supervisor.admin.errors import AdminUnreachable
    from supervisor.admin.status_view import render_status

    urls, token, ssl_context = replica_access(args)
    if args.fleet:
        return _fleet(args, urls, token, ssl_context)
    docs = dict(zip(urls, replica_statuses(urls, token, ssl_context), strict=True))
    if len(urls) == 1:
        doc = docs[urls[0]]
        if isinstance(doc, AdminUnreachable):
            raise doc
        problems = _problems(doc, args.check)
        if args.json:
            print_json(_judged(doc, problems, args.check), indent=2)
        else:
            print(render_status(doc))
        for problem in problems:
            print(f"status: {problem}", file=sys.stderr)
        return EXIT_ERROR if problems else EXIT_OK
    if args.json:
        print_json({url: failure_document(*failure(doc)) if isinstance(doc, AdminUnreachable)
                    else _judged(doc, _problems(doc, args.check), args.check)
                    for url, doc in docs.items()}, indent=2)
    failed = False
    rows: list[list[object]] = []
    for url in urls:
        doc = docs[url]
        if isinstance(doc, AdminUnreachable):
            failed = True
            rows.append([url, "-", "-", "-", "-", "-", "-", f"unreachable: {doc}"])
            continue
        problems = _problems(doc, args.check)
        failed = failed or bool(problems)
        rev = doc.get("revision") if isinstance(doc.get("revision"), dict) else {}
        assert isinstance(rev, dict)
        rejection = rev.get("last_rejection")
        note = "; ".join(problems) or (
            f"last rejection: {cell(rejection.get('revision'))} ({cell(rejection.get('reason'))})"
            if isinstance(rejection, dict) else "ok")
        up = rev.get("control_plane_up")
        rows.append([url, rev.get("desired"), rev.get("active"), rev.get("source"),
                     "-" if up is None else ("yes" if up else "NO"),
                     rev.get("consecutive_failures"), doc.get("version"), note])
    if not args.json:
        print(*table(("REPLICA", "DESIRED", "ACTIVE", "SOURCE", "CP UP", "FAILURES", "VERSION",
                      "STATE"), rows, right=(1, 2, 5)), sep="\n")
    return EXIT_ERROR if failed else EXIT_OK


class FleetAnswer(msgspec.Struct):
    """``status --fleet --json``."""

    ok: bool
    replicas: list[FleetRow]


def fleet_rows(args: argparse.Namespace, root: str, token: str | None,
               ssl_context: ssl.SSLContext | None) -> list[FleetRow]:
    """The walk from ``root`` (:mod:`supervisor.commands.fleet`), statements verified with
    the trusted keys of ``--config`` (``[control_plane]`` and ``[cache]``), if any."""
    from supervisor.commands.fleet import walk
    from supervisor.configfile import load
    from supervisor.sinks.lkg.keys import parse_trusted

    path = config_path(args, required=False)
    keys: list[str] = []
    if path is not None:
        config = load(path)
        keys = [*config.control_plane.trusted_keys, *config.cache.trusted_keys]
    trusted = parse_trusted(keys, where_key="--config trusted_keys") if keys else {}
    return trio.run(walk, root, token, ssl_context, trusted)


def _fleet(args: argparse.Namespace, urls: list[str], token: str | None,
           ssl_context: ssl.SSLContext | None) -> int:
    if len(urls) != 1:
        raise UsageError("--fleet walks from one root: pass one --url")
    rows = fleet_rows(args, urls[0], token, ssl_context)
    ok = all(row.state == "converged" for row in rows)
    if args.json:
        print_json(FleetAnswer(ok, rows), indent=2)
    else:
        print(*table(("DEPTH", "REPLICA", "SEQUENCE", "STATE", "REASON", "LAG", "DETAIL"),
                     [[row.depth, "  " * row.depth + row.url, row.sequence, row.state,
                       row.reason, None if row.lag_s is None else f"{row.lag_s:.1f}s",
                       row.detail] for row in rows], right=(0, 2, 5)), sep="\n")
    return EXIT_OK if ok else EXIT_ERROR


def _judged(doc: dict[str, Any], problems: list[str], check: bool) -> dict[str, Any]:
    """The document as the replica sent it, with ``--check``'s verdict as ``check``."""
    if not check:
        return doc
    return {**doc, "check": Check(not problems, "; ".join(problems) or "rollout done")}


def _problems(doc: dict[str, Any], check: bool) -> list[str]:
    from supervisor.admin.status_view import unhealthy

    return unhealthy(doc) + (rollout_problems(doc) if check else [])
