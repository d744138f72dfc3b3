"""The checks on a configuration that its types alone cannot say."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from supervisor.bounds import quoted
from supervisor.config import Config, is_loopback, sqlite_path
from supervisor.errors import ConfigError

__all__ = ["OWN_ENV_NAMES", "SYSTEM_DIRS", "check_files", "credential_files", "cross_check",
           "note_problem", "own_env_name", "placeholders", "unconfined_secrets", "value_at"]

T = TypeVar("T")

#: What the daemon itself reads from its environment: its settings
#: (SUPERVISOR_<SECTION>__<KEY>, the DSN among them), libpq's PG* variables, the
#: Kubernetes client's, systemd's, and the follower's HTTP client's (proxies,
#: which may carry a password, CA places, the netrc file). A name equal to one,
#: or starting with one ending in ``_`` or being ``PG``, is the daemon's own.
OWN_ENV_NAMES: tuple[str, ...] = (
    "SUPERVISOR_", "PG", "KUBECONFIG", "KUBERNETES_", "NOTIFY_SOCKET", "WATCHDOG_",
    "JOURNAL_STREAM", "SSL_CERT_", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
    "http_proxy", "https_proxy", "all_proxy", "no_proxy", "NETRC",
)

#: Never a secret's place: the kernel's and the devices' file systems, and the
#: service account Kubernetes mounts for the daemon itself.
SYSTEM_DIRS: tuple[str, ...] = (
    "/proc", "/sys", "/dev", "/run/secrets/kubernetes.io", "/var/run/secrets/kubernetes.io",
)


#: The keys naming a file the daemon reads a credential from.
_CREDENTIAL_KEYS = ("$.admin.token_file", "$.cache.signing_key", "$.control_plane.token_file",
                   "$.admin.read_token_file", "$.admin.tls_key_file",
                   "$.control_plane.client_key_file", "$.kubernetes.kubeconfig")
#: The keys naming a file the daemon reads (``check`` tries each).
_READ_KEYS = ("$.admin.token_file", "$.admin.read_token_file", "$.admin.tls_cert_file",
              "$.admin.tls_key_file", "$.admin.client_ca_file", "$.control_plane.ca_file",
              "$.control_plane.client_cert_file", "$.control_plane.client_key_file",
              "$.cache.signing_key", "$.kubernetes.kubeconfig")


def value_at(config: Config, key: str) -> Any:
    """The value of the key at ``$.section.key``."""
    section, _, name = key.removeprefix("$.").partition(".")
    return getattr(getattr(config, section), name)


_OWN_EXACT = frozenset(OWN_ENV_NAMES)
_OWN_PREFIXES = tuple(own for own in OWN_ENV_NAMES if own.endswith("_") or own == "PG")


def own_env_name(name: str) -> bool:
    """Is ``name`` a variable the daemon itself reads (:data:`OWN_ENV_NAMES`)?

    Asked once per ``env:`` secret reference of every revision compiled: one
    set lookup and one ``startswith`` over the prefixes, not a loop per name.
    """
    return name in _OWN_EXACT or name.startswith(_OWN_PREFIXES)


def credential_files(config: Config, environ: Mapping[str, str] | None = None,
                     config_path: str | None = None) -> list[tuple[str, str]]:
    """``(key, path)`` of every file the daemon reads a credential from.

    The files the configuration names: tokens, signing key, TLS private keys, kubeconfig.
    The configuration file itself (it may hold the DSN's password). And the files its
    clients read by default: libpq's password file and client key for each DSN, the
    kubeconfig of ``KUBECONFIG`` or ``~/.kube/config``, the follower's netrc file.
    """
    env = os.environ if environ is None else environ
    home = env.get("HOME") or os.path.expanduser("~")
    cp = config.control_plane
    found = [(key, value_at(config, key)) for key in _CREDENTIAL_KEYS]
    found.append(("the configuration file", config_path))
    found += [("KUBECONFIG", p) for p in env.get("KUBECONFIG", "").split(os.pathsep)]
    found.append(("the default kubeconfig", os.path.join(home, ".kube", "config")))
    found.append(("NETRC", env.get("NETRC") or os.path.join(home, ".netrc")))
    if cp.backend == "postgresql":
        from supervisor.dsn import credential_files as dsn_files

        for key, dsn in (("$.control_plane.url", cp.url),
                         ("$.control_plane.listen_url", cp.listen_url)):
            if dsn is not None:
                found += [(key, p) for p in dsn_files(dsn, env)]
    return [(key, os.path.expanduser(path)) for key, path in found if path]


def unconfined_secrets(config: Config) -> bool:
    """True when neither ``[revision].secret_env_prefixes`` nor ``secret_dirs`` is set:
    a publisher may then reference any variable or readable file (``check`` warns)."""
    return not config.revision.secret_env_prefixes and not config.revision.secret_dirs


def _check_upstream_url(url: str) -> None:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError("$.control_plane.url", f"bad port: {exc}") from exc
    if not parts.hostname or port is None or parts.path not in ("", "/") or parts.query \
            or parts.username or parts.password:
        raise ConfigError("$.control_plane.url", "follower mode expects http(s)://HOST:PORT "
                          "(the upstream replica's admin address, nothing after it)")


def _together(config: Config, section: str, first: str, second: str) -> None:
    """Refuse ``[section]`` with one of the two keys set and not the other."""
    missing = [key for key in (first, second) if value_at(config, f"$.{section}.{key}") is None]
    if len(missing) == 1:
        raise ConfigError(f"$.{section}.{missing[0]}", f"{section}.{first} and "
                          f"{section}.{second} go together (both or neither)")


def _check_admin_tls(config: Config, host: str) -> None:
    admin = config.admin
    _together(config, "admin", "tls_cert_file", "tls_key_file")
    tls = admin.tls_cert_file is not None
    if admin.client_ca_file is not None and not tls:
        raise ConfigError("$.admin.client_ca_file", "client certificates need TLS: set "
                          "admin.tls_cert_file and admin.tls_key_file")
    if not is_loopback(host) and not tls and not admin.allow_plaintext:
        raise ConfigError(
            "$.admin.allow_plaintext",
            f"admin.listen ({admin.listen}) is not a loopback address: serve TLS "
            "(admin.tls_cert_file, admin.tls_key_file) or set allow_plaintext = true "
            "(anyone on the path then reads the tokens and the revisions)")
    if admin.read_token_file is not None and admin.token_file is None:
        raise ConfigError("$.admin.read_token_file", "needs admin.token_file: without it "
                          "every route is open anyway")
    cp = config.control_plane
    _together(config, "control_plane", "client_cert_file", "client_key_file")
    tls_client = (cp.ca_file, cp.client_cert_file)
    if any(v is not None for v in tls_client) and not cp.url.startswith("https://"):
        raise ConfigError("$.control_plane.ca_file" if cp.ca_file is not None
                          else "$.control_plane.client_cert_file",
                          "only used in follower mode over TLS (control_plane.url = "
                          "https://HOST:PORT)")


def cross_check(config: Config) -> None:
    """The rules between keys (and files) that the types alone cannot say.

    The rules: the admin token off loopback; the control-plane URL's forms and each mode's
    needs; backoff and election durations against each other. No file the daemon writes is
    shared with another. No secret place admits the daemon's own credentials. The first
    broken rule raises :class:`~supervisor.errors.ConfigError` with the key's JSON path.
    :func:`~supervisor.configfile.load` runs it on every load.
    """
    try:
        host, _ = config.admin.host_port
    except ValueError as exc:
        raise ConfigError("$.admin.listen", str(exc)) from exc
    if not is_loopback(host) and config.admin.token_file is None:
        raise ConfigError(
            "$.admin.token_file",
            f"required when admin.listen ({config.admin.listen}) is not a loopback address")
    _check_admin_tls(config, host)
    cp = config.control_plane
    if not cp.url.startswith(("postgresql://", "postgres://", "sqlite:///", "http://", "https://")):
        raise ConfigError(
            "$.control_plane.url",
            "expected postgresql://..., sqlite:///PATH, or http(s)://HOST:PORT (follower mode)")
    if cp.backend == "postgresql":
        from supervisor.dsn import problem

        why = problem(cp.url)
        if why is not None:
            # The reason names the rule, never the value: the DSN holds a password.
            raise ConfigError("$.control_plane.url", why)
    if cp.backend == "follower":
        _check_upstream_url(cp.url)
        if not cp.trusted_keys:
            raise ConfigError(
                "$.control_plane.trusted_keys",
                "follower mode verifies every statement it receives: name the root's "
                "verify key(s) here (not this replica's own cache key)",
            )
    elif cp.trusted_keys or cp.token_file is not None:
        key = "trusted_keys" if cp.trusted_keys else "token_file"
        raise ConfigError(f"$.control_plane.{key}", "only used in follower mode "
                          "(control_plane.url = http(s)://HOST:PORT)")
    if cp.listen_url is not None and (
        cp.backend != "postgresql"
        or not cp.listen_url.startswith(("postgresql://", "postgres://"))
    ):
        raise ConfigError("$.control_plane.listen_url", "a postgresql://... DSN, and only "
                          "when control_plane.url is PostgreSQL")
    if cp.backoff_initial_s > cp.backoff_max_s:
        raise ConfigError("$.control_plane.backoff_initial_s",
                          "must not exceed control_plane.backoff_max_s")
    cache = config.cache
    if cache.path is not None and not cache.trusted_keys:
        raise ConfigError("$.cache.trusted_keys",
                          "required when cache.path is set (the verify keys to trust)")
    if cache.path is not None and cache.signing_key is None:
        raise ConfigError("$.cache.signing_key", "required when cache.path is set")
    kube = config.kubernetes
    if kube.renew_deadline_s >= kube.lease_duration_s:
        raise ConfigError("$.kubernetes.renew_deadline_s", "must be less than "
                          f"kubernetes.lease_duration_s ({kube.lease_duration_s:g}): a leader "
                          "must stop before its lease can expire for the others")
    if kube.retry_period_s >= kube.renew_deadline_s:
        raise ConfigError("$.kubernetes.retry_period_s", "must be less than "
                          f"kubernetes.renew_deadline_s ({kube.renew_deadline_s:g}): a renewal "
                          "needs more than one try before the deadline")
    _refuse_shared_files(config)
    _refuse_secret_places_holding_credentials(config)


def _refuse_secret_places_holding_credentials(config: Config) -> None:
    """[revision]'s secret places never admit what the daemon itself keeps secret.

    Whoever can publish chooses the references. A place admitting the admin token, the
    cache signing key or the daemon's settings would let them have the daemon hash those
    and serve the digest (docs/configuration.md). A ``..`` component makes a directory
    admit more than it appears to name. The resolver refuses these places anyway; this
    says so at load.
    """
    for i, prefix in enumerate(config.revision.secret_env_prefixes):
        own = next((o for o in OWN_ENV_NAMES if o.startswith(prefix)), None)
        if own is not None or own_env_name(prefix):
            raise ConfigError(f"$.revision.secret_env_prefixes[{i}]",
                              f"{prefix!r} admits variables the daemon itself reads "
                              f"({own or prefix}..., the control-plane DSN's among them)")
    credentials = [(key, path) for key, path in credential_files(config, {})
                   if key.startswith("$.")]
    for i, directory in enumerate(config.revision.secret_dirs):
        where = f"$.revision.secret_dirs[{i}]"
        if ".." in directory.split("/"):
            raise ConfigError(where, f"{directory!r} contains '..': name the directory "
                                     "itself")
        base = os.path.realpath(directory)
        for key, path in credentials:
            if os.path.realpath(path).startswith(base.rstrip("/") + "/"):
                raise ConfigError(where, f"{directory} holds {key} ({path}): keep the "
                                         "daemon's credentials outside the secret directories")


def _refuse_shared_files(config: Config) -> None:
    """Every file the daemon writes is its own: none may be another's (or the control plane).

    A snapshot path pointing at the SQLite control-plane file would replace the
    control plane with a JSON document at the first publish.
    """
    owners: dict[str, str] = {}
    cp = config.control_plane
    if cp.url.startswith("sqlite:///"):
        base = sqlite_path(cp.url)
        for suffix in ("", "-wal", "-shm", "-journal"):
            owners.setdefault(os.path.realpath(base + suffix), "$.control_plane.url")
    for key in ("$.cache.signing_key", "$.admin.token_file"):
        if value_at(config, key) is not None:
            owners.setdefault(os.path.realpath(value_at(config, key)), key)
    written = []
    if config.cache.path is not None:
        written += [("$.cache.path", config.cache.path),
                    ("$.cache.path", config.cache.path + ".served")]
    if config.snapshot.path is not None:
        written.append(("$.snapshot.path", config.snapshot.path))
    for where, path in written:
        real = os.path.realpath(path)
        other = owners.get(real)
        if other is not None and other != where:
            raise ConfigError(where, f"{path} is the same file as {other}: every file the "
                                     "daemon writes must be its own")
        owners[real] = where


def check_files(config: Config) -> list[tuple[str, str]]:
    """Check the files the configuration names; return (path, problem) pairs.

    Raises nothing, so ``check`` reports every problem at once. Not part of loading.
    """
    problems: list[tuple[str, str]] = []

    def parent_writable(key: str, value: str | None, *, created: bool = False) -> None:
        if value is None:
            return
        parent = Path(value).parent
        if created and not os.path.lexists(parent):
            return  # made at start, mode 0700 (the cache's constructor; `check` runs it too)
        if not parent.is_absolute() and not parent.is_dir():
            return  # made at start; statedirs.creation_problems says when it cannot be
        if not parent.is_dir():
            problems.append((key, f"directory {parent} does not exist"))
        elif not os.access(parent, os.W_OK):
            problems.append((key, f"directory {parent} is not writable"))

    for key in _READ_KEYS:
        value = value_at(config, key)
        if value is not None and not os.access(value, os.R_OK):
            problems.append((key, f"cannot read {value}"))
    problems += _tls_problems(config)
    if config.hook.command and shutil.which(config.hook.command[0]) is None:
        problems.append(("$.hook.command", f"{quoted(config.hook.command[0])} is no "
                         "executable file (nor a program on PATH)"))
    parent_writable("$.cache.path", config.cache.path, created=True)
    parent_writable("$.snapshot.path", config.snapshot.path)
    if config.control_plane.backend == "sqlite":
        parent_writable("$.control_plane.url", sqlite_path(config.control_plane.url))
    return problems


def note_problem(problems: list[tuple[str, str]], check: Callable[[], T]) -> T | None:
    """``check()``; when it raises ConfigError, None, and its ``(key, reason)`` added to
    ``problems`` (``check`` reports every problem, not only the first)."""
    try:
        return check()
    except ConfigError as exc:
        problems.append((exc.path, exc.reason))
        return None


def _tls_problems(config: Config) -> list[tuple[str, str]]:
    """The TLS files loaded as the daemon will load them (a key that does not match its
    certificate, a CA file holding no certificate)."""
    from supervisor.tlsconfig import server_context, upstream_context

    admin = config.admin
    problems: list[tuple[str, str]] = []
    if admin.tls_cert_file is not None and admin.tls_key_file is not None:
        note_problem(problems, partial(server_context, admin.tls_cert_file, admin.tls_key_file,
                                       admin.client_ca_file))
    note_problem(problems, partial(upstream_context, config.control_plane))  # over https only
    return problems


def placeholders(config: Config) -> list[tuple[str, str]]:
    """(path, problem) for each value the shipped examples leave for the operator to fill.

    Not part of :func:`load` (the shipped files must stay loadable as examples);
    ``check`` reports them and the commands that act refuse them, with what to do.
    """
    return [
        (f"$.cache.trusted_keys[{index}]",
         "still the placeholder: put the verify key that `trio-supervisor keygen` printed "
         "here (docs/operations.md, Kubernetes)")
        for index, key in enumerate(config.cache.trusted_keys) if "REPLACE" in key
    ]
