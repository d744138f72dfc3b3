"""``status``: one replica's report as a table, or one line per replica for several ``--url``.

Exit 1 when any replica is unreachable, not ready (no active snapshot) or has a
failed child, so it works as a health check over a fleet.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import trio

from supervisor.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    HTTP_SCHEMES,
    admin_base,
    admin_url,
    table,
)
from supervisor.reasons import DENIED, UNAVAILABLE

__all__ = ["cmd_status", "register"]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", action="append", default=None, type=admin_url(HTTP_SCHEMES),
                        help="admin API base URL, http://HOST:PORT (default: [admin].listen "
                             "of --config, else http://127.0.0.1:9464); repeat for several "
                             "replicas: one line each")
    parser.add_argument("--token-file", metavar="PATH", default=None,
                        help="file holding the admin bearer token (default: "
                             "[admin].token_file of --config)")
    parser.add_argument("--json", action="store_true",
                        help="print the raw /status JSON document instead of the table "
                             "(several --url: an object keyed by URL)")


def cmd_status(args: argparse.Namespace) -> int:
    from supervisor.admin.client import fetch_status
    from supervisor.admin.errors import AdminRefused, AdminUnreachable
    from supervisor.admin.status_view import render_status, unhealthy

    address, token = admin_base(args)
    urls = args.url or [f"http://{address}"]
    docs: dict[str, dict[str, Any] | AdminUnreachable] = {}

    async def fetch_all() -> None:
        async def one(url: str) -> None:
            try:
                docs[url] = await fetch_status(url, token)
            except AdminUnreachable as exc:
                docs[url] = exc

        async with trio.open_nursery() as nursery:
            for url in urls:
                nursery.start_soon(one, url)

    trio.run(fetch_all)
    failed = False
    if len(urls) == 1:
        doc = docs[urls[0]]
        if isinstance(doc, AdminUnreachable):
            print(f"status: {doc}", file=sys.stderr)
            if args.json:
                reason = DENIED if isinstance(doc, AdminRefused) else UNAVAILABLE
                print(json.dumps({"ok": False, "reason": reason, "detail": str(doc)}))
            return EXIT_ERROR
        print(json.dumps(doc, indent=2) if args.json else render_status(doc))
        for problem in unhealthy(doc):
            print(f"status: {problem}", file=sys.stderr)
            failed = True
        return EXIT_ERROR if failed else EXIT_OK
    if args.json:
        print(json.dumps({url: ({"error": str(doc)} if isinstance(doc, AdminUnreachable)
                                else doc) for url, doc in docs.items()}, indent=2))
    rows = []
    for url in urls:
        doc = docs[url]
        if isinstance(doc, AdminUnreachable):
            failed = True
            rows.append([url, "-", "-", "-", "-", "-", f"unreachable: {doc}"])
            continue
        problems = unhealthy(doc)
        failed = failed or bool(problems)
        rev = doc.get("revision") if isinstance(doc.get("revision"), dict) else {}
        assert isinstance(rev, dict)
        rejection = rev.get("last_rejection")
        note = "; ".join(problems) or (
            f"last rejection: {rejection.get('revision')} ({rejection.get('reason')})"
            if isinstance(rejection, dict) else "ok")
        up = rev.get("control_plane_up")
        rows.append([url, rev.get("desired"), rev.get("active"), rev.get("source"),
                     "-" if up is None else ("yes" if up else "NO"),
                     rev.get("consecutive_failures"), note])
    if not args.json:
        for line in table(("REPLICA", "DESIRED", "ACTIVE", "SOURCE", "CP UP", "FAILURES",
                           "STATE"), rows, right=(1, 2, 5)):
            print(line)
    return EXIT_ERROR if failed else EXIT_OK
