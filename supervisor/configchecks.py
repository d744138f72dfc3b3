"""The checks on a configuration that its types alone cannot say.

Contract:

- :func:`cross_check` enforces the rules between keys (and the files they
  name) on a decoded :class:`~supervisor.config.Config`: the admin token off
  loopback, the control-plane URL's forms and what each mode requires, the
  backoff and election durations against each other, no file written by the
  daemon shared with another, no secret place admitting the daemon's own
  credentials. The first rule broken raises
  :class:`~supervisor.errors.ConfigError` with the key's JSON path and the
  reason (:mod:`supervisor.configfile` runs it on every load; the CLI turns it
  into exit 2).
- :func:`check_files` and :func:`placeholders` raise nothing: they return
  (key path, problem) pairs about the files the configuration names and the
  values the shipped examples leave to fill, for ``check`` to report all at
  once. They are not part of loading.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from supervisor.config import Config, is_loopback, sqlite_path
from supervisor.errors import ConfigError

__all__ = ["check_files", "cross_check", "placeholders"]


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


def cross_check(config: Config) -> None:
    """The rules between keys (and files) that the types alone cannot say."""
    try:
        host, _ = config.admin.host_port
    except ValueError as exc:
        raise ConfigError("$.admin.listen", str(exc)) from exc
    if not is_loopback(host) and config.admin.token_file is None:
        raise ConfigError(
            "$.admin.token_file",
            f"required when admin.listen ({config.admin.listen}) is not a loopback address",
        )
    cp = config.control_plane
    if not cp.url.startswith(("postgresql://", "postgres://", "sqlite:///", "http://", "https://")):
        raise ConfigError(
            "$.control_plane.url",
            "expected postgresql://..., sqlite:///PATH, or http(s)://HOST:PORT (follower mode)",
        )
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
    elif cp.trusted_keys:
        raise ConfigError("$.control_plane.trusted_keys", "only used in follower mode "
                          "(control_plane.url = http(s)://HOST:PORT)")
    elif cp.token_file is not None:
        raise ConfigError("$.control_plane.token_file", "only used in follower mode "
                          "(control_plane.url = http(s)://HOST:PORT)")
    if cp.listen_url is not None and (
        cp.backend != "postgresql"
        or not cp.listen_url.startswith(("postgresql://", "postgres://"))
    ):
        raise ConfigError("$.control_plane.listen_url", "a postgresql://... DSN, and only "
                          "when control_plane.url is PostgreSQL")
    if cp.backoff_initial_s > cp.backoff_max_s:
        raise ConfigError(
            "$.control_plane.backoff_initial_s", "must not exceed control_plane.backoff_max_s"
        )
    cache = config.cache
    if cache.path is not None and not cache.trusted_keys:
        raise ConfigError(
            "$.cache.trusted_keys", "required when cache.path is set (the verify keys to trust)"
        )
    if cache.path is not None and cache.signing_key is None:
        raise ConfigError("$.cache.signing_key", "required when cache.path is set")
    election = config.kubernetes.election_problem()
    if election is not None:
        raise ConfigError(*election)
    _refuse_shared_files(config)
    _refuse_secret_places_holding_credentials(config)


# The daemon's own settings arrive as SUPERVISOR_<SECTION>__<KEY> (the DSN with its
# password among them): no env: reference may reach them.
_OWN_ENV_PREFIX = "SUPERVISOR_"


def _refuse_secret_places_holding_credentials(config: Config) -> None:
    """[revision]'s secret places never admit what the daemon itself keeps secret.

    Whoever can publish chooses the references; a place that admits the admin
    token, the cache signing key or the daemon's own settings would let them have
    the daemon hash those and serve the digest (docs/configuration.md). A ``..``
    component makes a directory admit more than it appears to name.
    """
    for i, prefix in enumerate(config.revision.secret_env_prefixes):
        if prefix.startswith(_OWN_ENV_PREFIX) or _OWN_ENV_PREFIX.startswith(prefix):
            raise ConfigError(f"$.revision.secret_env_prefixes[{i}]",
                              f"{prefix!r} admits the daemon's own {_OWN_ENV_PREFIX}* "
                              "settings (the control-plane DSN among them)")
    credentials = [("$.admin.token_file", config.admin.token_file),
                   ("$.cache.signing_key", config.cache.signing_key)]
    for i, directory in enumerate(config.revision.secret_dirs):
        where = f"$.revision.secret_dirs[{i}]"
        if ".." in directory.split("/"):
            raise ConfigError(where, f"{directory!r} contains '..': name the directory "
                                     "itself")
        base = os.path.realpath(directory)
        for key, path in credentials:
            if path is not None and os.path.realpath(path).startswith(base.rstrip("/") + "/"):
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
    if config.cache.signing_key is not None:
        owners.setdefault(os.path.realpath(config.cache.signing_key), "$.cache.signing_key")
    if config.admin.token_file is not None:
        owners.setdefault(os.path.realpath(config.admin.token_file), "$.admin.token_file")
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
    """Check the files the configuration names; return (path, problem) pairs."""
    problems: list[tuple[str, str]] = []

    def readable(key: str, value: str | None) -> None:
        if value is not None and not os.access(value, os.R_OK):
            problems.append((key, f"cannot read {value}"))

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

    readable("$.admin.token_file", config.admin.token_file)
    readable("$.cache.signing_key", config.cache.signing_key)
    readable("$.kubernetes.kubeconfig", config.kubernetes.kubeconfig)
    parent_writable("$.cache.path", config.cache.path, created=True)
    parent_writable("$.snapshot.path", config.snapshot.path)
    if config.control_plane.backend == "sqlite":
        parent_writable("$.control_plane.url", sqlite_path(config.control_plane.url))
    return problems


def placeholders(config: Config) -> list[tuple[str, str]]:
    """(path, problem) for each value the shipped examples leave for the operator to fill.

    Not part of :func:`load` (the shipped files must stay loadable as examples);
    ``check`` reports them and the commands that act refuse them, with what to do.
    """
    return [
        (f"$.cache.trusted_keys[{index}]",
         "still the placeholder: put the verify key that `trio-supervisor keygen` printed "
         "here (README.rst, Operations)")
        for index, key in enumerate(config.cache.trusted_keys) if "REPLACE" in key
    ]
