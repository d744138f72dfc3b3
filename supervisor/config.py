"""The configuration's schema: every section and key, their bounds, the rules between them.

Contract (docs/configuration.md): unknown keys are errors; every key can be
overridden from the environment as ``SUPERVISOR_<SECTION>__<KEY>``; an invalid
file is refused with the JSON-path of the bad key and the reason, which the
CLI turns into exit 2.

Durations, in seconds, each with a sane minimum and a finite maximum (the
error names both)::

    supervisor.shutdown_grace_s       0.1 .. 3600   below 0.1 s nothing can close
    supervisor.restart_period_s       1 .. 86400
    control_plane.poll_interval_s     0.01 .. 86400 (a day)
    control_plane.backoff_initial_s   0.01 .. 3600
    control_plane.backoff_max_s       0.01 .. 3600  (also >= backoff_initial_s)
    kubernetes.preflight_retry_s      0.1 .. 86400
    kubernetes.lease_duration_s       1 .. 3600    (renew_deadline_s < lease_duration_s)
    kubernetes.renew_deadline_s       0.5 .. 3600  (retry_period_s < renew_deadline_s)
    kubernetes.retry_period_s         0.1 .. 3600

Reading a file, the environment overrides and the error messages:
:mod:`supervisor.configfile`.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
import msgspec.inspect

from supervisor.errors import ConfigError

__all__ = [
    "AdminConfig",
    "CacheConfig",
    "Config",
    "ControlPlaneConfig",
    "KubernetesConfig",
    "LogConfig",
    "RevisionConfig",
    "SnapshotConfig",
    "SupervisorConfig",
    "check_files",
    "cross_check",
    "placeholders",
]

ENV_PREFIX = "SUPERVISOR_"
CONFIG_ENV = "SUPERVISOR_CONFIG"

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
# Durations (module docstring): inf and nan fail these bounds too.
GraceSeconds = Annotated[float, msgspec.Meta(ge=0.1, le=3600.0)]
PeriodSeconds = Annotated[float, msgspec.Meta(ge=1.0, le=86400.0)]
PollSeconds = Annotated[float, msgspec.Meta(ge=0.01, le=86400.0)]
BackoffSeconds = Annotated[float, msgspec.Meta(ge=0.01, le=3600.0)]
RetrySeconds = Annotated[float, msgspec.Meta(ge=0.1, le=86400.0)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]

LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


class SupervisorConfig(_Section, frozen=True):
    shutdown_grace_s: GraceSeconds = 10.0
    restart_intensity: NonNegativeInt = 5
    restart_period_s: PeriodSeconds = 60.0


class LogConfig(_Section, frozen=True):
    level: LogLevel = "info"
    format: Literal["auto", "json", "console", "journal"] = "auto"


class ControlPlaneConfig(_Section, frozen=True):
    url: str = "sqlite:///var/controlplane.db"
    poll_interval_s: PollSeconds = 5.0
    listen: bool = True
    channel: Annotated[str, msgspec.Meta(pattern=r"^[a-z_][a-z0-9_]{0,62}$")] = (
        "supervisor_desired"
    )
    # At most 1 GiB: a body is held in memory (about 7x while it compiles).
    max_revision_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 30)] = 16 * 1024 * 1024
    backoff_initial_s: BackoffSeconds = 0.25
    backoff_max_s: BackoffSeconds = 30.0
    # Follower mode only: the upstream replica's admin token.
    token_file: str | None = None
    # PostgreSQL only: a direct connection for LISTEN when url goes through a
    # transaction-pooling PgBouncer (which cannot carry LISTEN).
    listen_url: str | None = None

    @property
    def backend(self) -> Literal["postgresql", "sqlite", "follower"]:
        if self.url.startswith("sqlite:"):
            return "sqlite"
        if self.url.startswith(("http://", "https://")):
            return "follower"
        return "postgresql"

    @property
    def listen_dsn(self) -> str:
        """Where the LISTEN child connects: ``listen_url`` when set, else ``url``."""
        return self.listen_url or self.url


class CacheConfig(_Section, frozen=True):
    path: str | None = None
    signing_key: str | None = None
    trusted_keys: list[str] = msgspec.field(default_factory=list)
    # False (the seed's rule): a boot whose desired revision does not compile
    # refuses (exit 3). True: it serves a valid signed cache instead.
    serve_when_desired_refused: bool = False


class SnapshotConfig(_Section, frozen=True):
    path: str | None = None


HostName = Annotated[str, msgspec.Meta(pattern=r"^(\*|\.?[A-Za-z0-9_.:\[\]-]+)$")]


class AdminConfig(_Section, frozen=True):
    listen: str = "127.0.0.1:9464"
    token_file: str | None = None
    # Host names (or addresses, ".domain" for a domain and its subdomains, "*"
    # for any) the admin API answers to besides the listen address and loopback.
    allowed_hosts: list[HostName] = msgspec.field(default_factory=list)

    @property
    def host_port(self) -> tuple[str, int]:
        return split_host_port(self.listen)


class RevisionConfig(_Section, frozen=True):
    # Where a revision's secret references may point (docs/configuration.md): an
    # env: reference's name must start with one of the prefixes, a file:
    # reference must lie under one of the directories. Empty = anywhere.
    secret_env_prefixes: list[Annotated[str, msgspec.Meta(min_length=1)]] = msgspec.field(
        default_factory=list
    )
    secret_dirs: list[Annotated[str, msgspec.Meta(min_length=1)]] = msgspec.field(
        default_factory=list
    )


class KubernetesConfig(_Section, frozen=True):
    enabled: bool = False
    kubeconfig: str | None = None
    control_namespace: str = "trio-supervisor"
    apps_namespace: str = "apps"
    field_manager: str = "trio-supervisor"
    preflight_retry_s: RetrySeconds = 300.0
    # Issue 13: which installation owns a child (the label on every child and part of every
    # sweep selector; None = the control namespace), the periodic resync, and the client-side
    # rate limit (a token bucket, as client-go's QPS and Burst).
    installation: Annotated[
        str, msgspec.Meta(pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
    ] | None = None
    resync_s: RetrySeconds = 600.0
    qps: PositiveFloat = 200.0
    burst: Annotated[int, msgspec.Meta(ge=1)] = 400
    # Issue 14: leader election for the fan-out on a coordination.k8s.io/v1 Lease
    # (controller-runtime's defaults). identity None = hostname, pid and a random suffix.
    leader_election: bool = True
    lease_name: Annotated[
        str, msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
    ] = "trio-supervisor-fanout"
    lease_duration_s: Annotated[float, msgspec.Meta(ge=1.0, le=3600.0)] = 15.0
    renew_deadline_s: Annotated[float, msgspec.Meta(ge=0.5, le=3600.0)] = 10.0
    retry_period_s: Annotated[float, msgspec.Meta(ge=0.1, le=3600.0)] = 2.0
    identity: Annotated[str, msgspec.Meta(min_length=1, max_length=128,
                                          pattern=r"^[A-Za-z0-9._:@-]+$")] | None = None

    def election_problem(self) -> tuple[str, str] | None:
        """(key path, reason) when the election's durations cannot work together, else None."""
        if self.renew_deadline_s >= self.lease_duration_s:
            return ("$.kubernetes.renew_deadline_s",
                    f"must be less than kubernetes.lease_duration_s ({self.lease_duration_s:g}):"
                    " a leader must stop before its lease can expire for the others")
        if self.retry_period_s >= self.renew_deadline_s:
            return ("$.kubernetes.retry_period_s",
                    f"must be less than kubernetes.renew_deadline_s ({self.renew_deadline_s:g}):"
                    " a renewal needs more than one try before the deadline")
        return None

    @property
    def installation_label(self) -> str:
        """The value of ``platform.trio-supervisor.dev/installation`` on our children."""
        return self.installation or self.control_namespace


class Config(_Section, frozen=True):
    supervisor: SupervisorConfig = msgspec.field(default_factory=SupervisorConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    control_plane: ControlPlaneConfig = msgspec.field(default_factory=ControlPlaneConfig)
    cache: CacheConfig = msgspec.field(default_factory=CacheConfig)
    snapshot: SnapshotConfig = msgspec.field(default_factory=SnapshotConfig)
    admin: AdminConfig = msgspec.field(default_factory=AdminConfig)
    kubernetes: KubernetesConfig = msgspec.field(default_factory=KubernetesConfig)
    revision: RevisionConfig = msgspec.field(default_factory=RevisionConfig)


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


def split_host_port(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"`` or ``"[::1]:9464"`` -> (host, port); ValueError when malformed."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT, got {listen!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
        if not config.cache.trusted_keys:
            raise ConfigError(
                "$.cache.trusted_keys",
                "follower mode verifies every revision it receives: name the upstream's "
                "verify key(s) here",
            )
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


def sqlite_path(url: str) -> str:
    """``sqlite:///var/cp.db`` -> ``var/cp.db``; ``sqlite:////abs/cp.db`` -> ``/abs/cp.db``."""
    return url[len("sqlite:///") :]
