"""What the subcommands share: exit codes, configuration, a store for one call, admin access.

Also the ``--json`` documents' text; the tables' text is :mod:`supervisor.texttable`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec
import trio

from supervisor.bounds import cut
from supervisor.config import CONFIG_ENV, Config, RevisionConfig, sqlite_path
from supervisor.configchecks import placeholders
from supervisor.configfile import env_warnings, load
from supervisor.errors import ConfigError, SupervisorError, UsageError, find_leaf
from supervisor.reasons import DENIED, INVALID, REVISION_REASONS, UNAVAILABLE
from supervisor.statedirs import CONTROL_PLANE, make_state_directories
from supervisor.threads import in_thread

if TYPE_CHECKING:
    from supervisor.admin.errors import AdminUnreachable
    from supervisor.controlplane.store import RevisionAdmin

__all__ = [
    "EXIT_ERROR", "EXIT_GAVE_UP", "EXIT_OK", "EXIT_REFUSED", "EXIT_REPLICA_REFUSED",
    "EXIT_USAGE", "HTTP_SCHEMES", "REPLICA_SCHEMES", "Failure", "ReferenceResolver",
    "add_ca_file", "add_flags", "add_replicas", "add_token_file", "add_url", "admin_base",
    "admin_url", "config_path", "describe_store", "failure", "failure_document", "gather", "iso",
    "load_config", "print_json", "replica_access", "replica_statuses", "sqlite_file",
    "with_store",
]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_REFUSED, EXIT_GAVE_UP = 0, 1, 2, 3, 4
#: ``publish --wait``: a replica refused the revision.
EXIT_REPLICA_REFUSED = 5

T = TypeVar("T")
U = TypeVar("U")

#: What ``status --url`` reads (``/status`` is plain HTTP).
HTTP_SCHEMES = ("http", "https")
#: What ``watch --url`` and ``publish --wait --url`` read: a replica's HTTP base or its stream.
REPLICA_SCHEMES = ("http", "https", "ws", "wss")


#: ``//user:password@`` (or ``//user@``) of a URL, before its host.
_CREDENTIALS = re.compile(r"//[^/?#@]*@")


def admin_url(schemes: Sequence[str]) -> Callable[[str], str]:
    """The argparse type of every ``--url`` naming a replica.

    It must be a URL with one of ``schemes``, a host and a valid port. Otherwise a usage
    error names the option (exit 2), before anything is stored or sent.
    """

    def check(text: str) -> str:
        import httpx  # at parse time, not when the parser is built

        example = f"{schemes[0]}://HOST:PORT"
        shown = _CREDENTIALS.sub("//***@", text.strip())
        if shown != text.strip():
            # httpx would send them as Basic auth in place of the bearer token, and the
            # URL is repeated in every error line and --json document.
            raise argparse.ArgumentTypeError(
                f"{shown!r} carries credentials (user:password@), which are never sent; "
                f"drop them and pass the admin token with --token-file")
        try:
            url = httpx.URL(text.strip())
        except httpx.InvalidURL as exc:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a URL ({exc}); expected {example}") from exc
        problem = None
        if url.scheme not in schemes:
            hint = ""
            if not url.host and url.scheme and ":" in text and "//" not in text:
                hint = f" (did you mean {schemes[0]}://{text.strip()}?)"
            scheme = f"scheme {url.scheme!r}" if url.scheme else "no scheme"
            problem = f" has {scheme}; expected {' or '.join(schemes)} ({example}){hint}"
        elif not url.host:
            problem = f" names no host; expected {example}"
        elif url.port is not None and not 0 < url.port < 65536:
            problem = f": port {url.port} is not between 1 and 65535"
        elif url.query or url.fragment:
            # The command appends /status (or /v1/stream): it would ask for something else.
            problem = f" has a query or fragment; expected {example} (a path prefix is kept)"
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{text!r}{problem}")
        return text.strip()

    return check


def add_flags(parser: argparse.ArgumentParser, helps: dict[str, str]) -> None:
    """One ``store_true`` option per ``--name: help``, in that order."""
    for flag, what in helps.items():
        parser.add_argument(flag, action="store_true", help=what)


def add_token_file(parser: argparse.ArgumentParser,
                   what: str = "file holding the admin bearer token") -> None:
    """``--token-file``, the admin token :func:`admin_base` reads (else the config's)."""
    parser.add_argument("--token-file", metavar="PATH", default=None,
                        help=f"{what} (default: [admin].token_file of --config)")


def add_ca_file(parser: argparse.ArgumentParser, verified: str) -> None:
    """``--ca-file``, the CA that ``verified`` (the replicas' certificates) is checked with."""
    parser.add_argument("--ca-file", metavar="PATH", default=None,
                        help=f"{verified} verified against (default: the system's trust store)")


def add_url(parser: argparse.ArgumentParser, schemes: Sequence[str], what: str, *,
            many: bool = True) -> None:
    """``--url`` naming a replica (``many``: repeatable), checked by :func:`admin_url`."""
    parser.add_argument("--url", action="append" if many else "store", default=None,
                        metavar="URL", type=admin_url(schemes), help=what)


def add_replicas(parser: argparse.ArgumentParser, schemes: Sequence[str], urls: str,
                 ca: str, token: str = "file holding the admin bearer token") -> None:
    """``--url`` (repeatable), ``--token-file`` and ``--ca-file``: what
    :func:`replica_access` reads."""
    add_url(parser, schemes, urls)
    add_token_file(parser, token)
    add_ca_file(parser, ca)


def replica_access(args: argparse.Namespace, scheme: str = "http", *, path: str = "",
                   ) -> tuple[list[str], str | None, ssl.SSLContext | None]:
    """The replicas a command asks (each ``--url``, else the one :func:`admin_base` names),
    their token, and what a TLS one is verified with (``--ca-file``; None: the system's)."""
    from supervisor.admin.client import ca_file_context

    default, token = admin_base(args, scheme, path=path)
    urls = args.url or [default]
    return [urls] if isinstance(urls, str) else urls, token, ca_file_context(args.ca_file)


def gather(fn: Callable[[U], Awaitable[T]], items: Sequence[U]) -> list[T]:
    """``fn`` of every item at once under ``trio.run``; the results in the items' order."""
    results: dict[int, T] = {}

    async def each() -> None:
        async def one(i: int, item: U) -> None:
            results[i] = await fn(item)

        async with trio.open_nursery() as nursery:
            for i, item in enumerate(items):
                nursery.start_soon(one, i, item)

    trio.run(each)
    return [results[i] for i in range(len(items))]


def replica_statuses(urls: Sequence[str], token: str | None, ssl_context: ssl.SSLContext | None,
                     timeout_s: float = 5.0) -> list[dict[str, Any] | AdminUnreachable]:
    """Each replica's ``/status`` document (:func:`~supervisor.admin.client.fetch_status`),
    or why it could not be read."""
    from supervisor.admin.client import fetch_status
    from supervisor.admin.errors import AdminUnreachable

    async def one(url: str) -> dict[str, Any] | AdminUnreachable:
        try:
            return await fetch_status(url, token, timeout_s=timeout_s, ssl_context=ssl_context)
        except AdminUnreachable as exc:
            return exc

    return gather(one, urls)


def config_path(args: argparse.Namespace, required: bool = True) -> str | None:
    path = getattr(args, "config", None) or os.environ.get(CONFIG_ENV) or None
    if path is None and required:
        raise UsageError(f"no configuration: pass --config PATH or set {CONFIG_ENV}")
    return path


def load_config(args: argparse.Namespace) -> tuple[Config, str]:
    path = config_path(args)
    assert path is not None
    config = load(path)
    if getattr(args, "command", None) not in (None, "run"):  # run logs them
        for _, warning in env_warnings():
            print(f"warning: {warning}", file=sys.stderr)
    for key, problem in placeholders(config):
        raise ConfigError(key, problem, source=path)
    require_sqlite_directory(config)
    return config, path


def require_sqlite_directory(config: Config) -> None:
    """Name the missing directory of an SQLite control plane (SQLite says only
    "unable to open database file"); exit 2, as no restart creates it.

    A relative path's directory is left alone: ``run`` and ``publish`` make it
    (supervisor/statedirs.py), the other commands report the missing file.
    """
    parent = sqlite_file(config).parent
    if config.control_plane.backend == "sqlite" and parent.is_absolute() and not parent.is_dir():
        raise ConfigError(
            "$.control_plane.url",
            f"directory {parent} (of {config.control_plane.url}, relative to "
            f"{Path.cwd()}) does not exist; create it (mkdir -p {parent}) or fix the URL",
        )


def sqlite_file(config: Config) -> Path:
    """The file of an SQLite control plane (meaningless for another backend)."""
    return Path(sqlite_path(config.control_plane.url))


def describe_store(config: Config) -> str:
    """The control plane as an operator can find it again.

    An SQLite file by its absolute path (a relative one is under this working
    directory); a PostgreSQL URL redacted.
    """
    from supervisor.dsn import redact

    if config.control_plane.backend == "sqlite":
        return os.path.abspath(sqlite_file(config))
    return redact(config.control_plane.url)


def with_store(config: Config, fn: Callable[[RevisionAdmin], Awaitable[T]], *,
               create: bool = False, writes: bool = False) -> T:
    """Run ``fn`` with a store for ``config`` (closed afterwards) under ``trio.run``.

    ``create=False`` (every command but ``publish``): a missing SQLite file is
    an error naming it, not a new empty control plane. ``writes``: the schema is
    checked first (:func:`require_current_schema`), so nothing is written to a
    database this build has not migrated.
    """
    from supervisor.controlplane.errors import ControlPlaneError
    from supervisor.controlplane.factory import open_admin
    from supervisor.revision.document import SCHEMA_VERSION

    if create:
        make_state_directories(config, keys={CONTROL_PLANE})  # the file's directory, if relative
    lite = config.control_plane.backend == "sqlite"
    found = None
    look = writes and config.control_plane.backend in ("sqlite", "postgresql")
    if look and not (lite and not sqlite_file(config).is_file()):
        try:
            found = probe_schema(config)
        except Exception:  # noqa: BLE001 - outside trio.run; the store's own call says why
            pass
        else:
            require_current_schema(config, found, may_create=create and lite)

    async def run() -> T:
        try:
            store = open_admin(config.control_plane, max_schema_version=SCHEMA_VERSION,
                               create=create)
        except ControlPlaneError as exc:
            raise UsageError(str(exc)) from exc  # a follower: no control plane of its own
        try:
            if create and lite and found is None:
                await store.migrate()  # a new file: this build's schema
            return await fn(store)
        finally:
            await store.aclose()

    return trio.run(run)


#: How long a command waits for the control plane's schema version, in all: whatever the
#: DSN's own ``connect_timeout`` and however many hosts it names (libpq's timeout is per
#: host, 2 s at least), the look stays quick.
SCHEMA_PROBE_S = 2.0


def probe_schema(config: Config) -> int | None:
    """The control plane's schema version (None: no schema yet), read-only, within
    :data:`SCHEMA_PROBE_S` (TimeoutError past it). Nothing outlives the look on the
    server's session (the statement bound is per transaction, as PgBouncer's
    transaction pooling requires)."""

    async def look() -> int | None:
        # Abandoned, not waited for, past the bound (ThreadDeadline, a TimeoutError).
        return await in_thread(partial(_schema_version, config), dependency="database",
                               deadline_s=SCHEMA_PROBE_S, what="the schema probe")

    return trio.run(look)


def _schema_version(config: Config) -> int | None:
    """The control plane's schema version, read-only (blocking; None: no schema yet)."""
    from supervisor.controlplane import migrations

    cp = config.control_plane
    if cp.backend == "sqlite":
        import sqlite3
        from urllib.parse import quote

        path = sqlite_path(cp.url)
        if not Path(path).is_file():
            return None
        lite = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=1)
        try:
            return migrations.sqlite_version(lite)
        finally:
            lite.close()
    from supervisor.controlplane.postgres import bounded, connect, timeout_ms

    with connect(cp.url, connect_timeout_s=SCHEMA_PROBE_S, statement_timeout_s=None) as pg:
        return bounded(pg, migrations.postgres_version, timeout_ms(SCHEMA_PROBE_S))


def require_current_schema(config: Config, found: int | None, *, may_create: bool) -> None:
    """UsageError (exit 2, naming ``db migrate``) unless the schema ``found`` is this
    build's (None, no schema, is fine where ``may_create``); SchemaTooNew past it."""
    from supervisor.controlplane import migrations

    backend: Literal["sqlite", "postgresql"] = (
        "sqlite" if config.control_plane.backend == "sqlite" else "postgresql")
    migrations.check_not_newer(found, backend)
    latest = migrations.latest_version(backend)
    if found is None and not may_create:
        raise UsageError("the control plane has no schema yet: run `trio-supervisor db "
                         "migrate` first; nothing was changed")
    if found is not None and found < latest:
        raise UsageError(f"the control-plane schema is version {found}, older than this "
                         f"build's {latest}: run `trio-supervisor db migrate` first; nothing "
                         f"was changed")


def admin_base(args: argparse.Namespace, scheme: str = "http", *,
               path: str = "") -> tuple[str, str | None]:
    """The admin URL of the replica named by --config (or the default), and its token.

    ``scheme`` (http, ws) becomes https or wss when that replica serves TLS, verified
    against --ca-file. A wildcard listen address is asked on loopback.
    """
    import httpx

    from supervisor.tokenfile import read_token

    config_file = config_path(args, required=False)
    token = None
    token_file = getattr(args, "token_file", None)
    if config_file is not None:
        config = load(config_file)
        if config.admin.token_file and token_file is None:
            token = read_token(config.admin.token_file, "$.admin.token_file")
        host, port = config.admin.host_port
        if config.admin.tls_cert_file is not None:
            scheme += "s"
    else:
        host, port = "127.0.0.1", 9464
    if token_file is not None:
        try:
            token = read_token(token_file, "--token-file")
        except ConfigError as exc:
            raise UsageError(f"--token-file: {exc.reason}") from exc
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return str(httpx.URL(scheme=scheme, host=host, port=port, path=path)), token


class ReferenceResolver:
    """Each secret reference stands in for its value: compiles everything but the secrets.

    The secrets may exist only on the replicas' hosts. Where a reference may point does
    not depend on the secret. Given ``[revision]`` (``confinement``), a reference outside
    ``secret_env_prefixes`` or ``secret_dirs`` is refused (``secret``) in the daemon's
    own words, as every replica would refuse it. Nothing is looked up or read.
    """

    def __init__(self, confinement: RevisionConfig | None = None) -> None:
        self._confinement = confinement

    def resolve(self, reference: str) -> bytes:
        if self._confinement is not None:
            from supervisor.revision.secrets import EnvFileResolver

            EnvFileResolver.from_config(self._confinement).check_place(reference)
        return reference.encode()


def iso(value: datetime | None) -> str | None:
    """ISO-8601 UTC with milliseconds and a ``Z``, as the stores write it."""
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


class Failure(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``{"ok": false, "reason", "detail"}`` (and ``"file"`` where one is named): a command
    refused or failed before its answer. Made by :func:`failure_document`."""

    ok: Literal[False]
    reason: str
    detail: str
    file: str | None = None


def failure(exc: BaseException) -> tuple[str, str]:
    """(reason label of docs/reasons.md, detail) of a command's failure.

    A store's or a revision's own label wins (``not_found``, ``corrupt``...), also behind
    the usage error that names it. A bad argument or configuration is ``invalid``.
    A replica that refuses the token is ``denied``. One that does not answer is
    ``unavailable``, as is anything else that kept the command from its answer.
    """
    from supervisor.admin.errors import AdminRefused

    found = find_leaf(exc, (SupervisorError,)) or exc
    detail = str(found) or type(found).__name__
    cause: BaseException | None = found
    while cause is not None:
        label = getattr(cause, "reason", None)
        if label in REVISION_REASONS and not isinstance(cause, ConfigError):
            return str(label), detail
        cause = cause.__cause__
    if isinstance(found, ConfigError | UsageError):
        return INVALID, detail
    if isinstance(found, AdminRefused):
        return DENIED, detail
    return UNAVAILABLE, detail


def failure_document(reason: str, detail: str, *, file: str | None = None) -> Failure:
    """Every command's ``--json`` failure: the reason label (docs/reasons.md), the detail
    cut to 1 KiB, and the file the failure is about, if any."""
    return Failure(ok=False, reason=reason, detail=cut(detail), file=file)


def print_json(value: object, *, indent: int | None = None, flush: bool = False) -> None:
    """``value`` as the standard library's JSON of its builtins: the same on every terminal.

    ``value`` is a Struct, or builtins holding Structs; each command declares what its
    ``--json`` prints beside it. Items are separated by ``", "`` and ``": "``; non-ASCII is escaped.
    """
    print(json.dumps(msgspec.to_builtins(value), indent=indent), flush=flush)
