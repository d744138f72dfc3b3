"""The configuration's schema: every section and key, their types and bounds.

Loading, environment overrides and errors: :mod:`supervisor.configfile`.
The rules between keys that the types cannot say: :mod:`supervisor.configchecks`.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

import msgspec

__all__ = ["CONFIG_ENV", "ENV_PREFIX", "AdminConfig", "CacheConfig", "Config", "ControlPlaneConfig",
           "HookConfig", "KubernetesConfig", "LogConfig", "RevisionConfig", "SnapshotConfig",
           "SupervisorConfig", "is_loopback", "split_host_port", "sqlite_path"]

ENV_PREFIX = "SUPERVISOR_"
CONFIG_ENV = "SUPERVISOR_CONFIG"

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
# Durations in seconds, each with a sane minimum and a finite maximum (the error
# names both); inf and nan fail these bounds too.
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
    shutdown_grace_s: GraceSeconds = 10.0  # below 0.1 s nothing can close
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
    backoff_max_s: BackoffSeconds = 30.0  # also >= backoff_initial_s (configchecks)
    # One database call (connect and statement) ends within this, a hydrate
    # within this plus 1 s per min_read_rate_kib_s KiB of its body.
    read_timeout_s: Annotated[float, msgspec.Meta(ge=0.5, le=3600.0)] = 17.0
    min_read_rate_kib_s: Annotated[float, msgspec.Meta(ge=1.0, le=1 << 20)] = 256.0
    # Follower mode only: the upstream replica's admin token.
    token_file: str | None = None
    # Follower mode only: the root's verify keys (ed25519:...) its statements must carry.
    trusted_keys: list[str] = msgspec.field(default_factory=list)
    # Follower mode only: the root identity to follow (None: the first one accepted).
    root_identity: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None
    # Follower mode only: one fetch of the upstream's statement, as a whole.
    fetch_timeout_s: Annotated[float, msgspec.Meta(ge=0.1, le=3600.0)] = 10.0
    # Follower mode only: stream hints within this interval cause at most one fetch.
    hint_min_interval_s: Annotated[float, msgspec.Meta(ge=0.0, le=60.0)] = 0.1
    # PostgreSQL only: a direct connection for LISTEN when url goes through a
    # transaction-pooling PgBouncer (which cannot carry LISTEN).
    listen_url: str | None = None
    # At most one notification wake-up per this many seconds, however many NOTIFYs
    # arrive (anyone who may connect may NOTIFY the channel); 0 = no floor.
    notify_min_interval_s: Annotated[float, msgspec.Meta(ge=0.0, le=60.0)] = 0.05
    # Follower mode over https://: the CA the upstream's certificate is verified
    # against (None: the system's trust store), and the certificate and key this
    # follower presents when the upstream requires client certificates.
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None

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
    # False: a boot whose desired revision does not compile
    # refuses (exit 3). True: it serves a valid signed cache instead.
    serve_when_desired_refused: bool = False
    # A root's signed statement is valid this long; it is re-signed at half of it.
    statement_ttl_s: Annotated[float, msgspec.Meta(ge=1.0, le=30 * 86400.0)] = 300.0


class SnapshotConfig(_Section, frozen=True):
    path: str | None = None


class HookConfig(_Section, frozen=True):
    # Run after each swap, without a shell (argv); empty: no hook.
    command: list[str] = msgspec.field(default_factory=list)
    timeout_s: Annotated[float, msgspec.Meta(gt=0.0, le=3600.0)] = 30.0


HostName = Annotated[str, msgspec.Meta(pattern=r"^(\*|\.?[A-Za-z0-9_.:\[\]-]+)$")]
OriginName = Annotated[
    str, msgspec.Meta(pattern=r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?$")
]


class AdminConfig(_Section, frozen=True):
    listen: str = "127.0.0.1:9464"
    token_file: str | None = None
    # Host names (or addresses, ".domain" for a domain and its subdomains, "*"
    # for any) the admin API answers to besides the listen address and loopback.
    allowed_hosts: list[HostName] = msgspec.field(default_factory=list)
    # Origins (scheme://host[:port]) a browser page may drive the API from besides
    # the listener's own (a WebSocket handshake, POST /v1/converge).
    allowed_origins: list[OriginName] = msgspec.field(default_factory=list)
    # HTTPS and WSS (both or neither), and mutual TLS with client_ca_file.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    client_ca_file: str | None = None
    # A non-loopback listener without TLS must say so.
    allow_plaintext: bool = False
    # A second token, accepted for the GET routes (and the stream) only.
    read_token_file: str | None = None
    # The address this replica names itself by to its upstream (else its listen address).
    advertise_url: Annotated[str, msgspec.Meta(
        pattern=r"^https?://[A-Za-z0-9._~%:\[\]-]+(/[A-Za-z0-9._~%/:@!$&'()*+,;=-]*)?$",
        max_length=512)] | None = None

    @property
    def host_port(self) -> tuple[str, int]:
        return split_host_port(self.listen)


class RevisionConfig(_Section, frozen=True):
    # Where a revision's secret references may point (docs/configuration.md): an
    # env: reference's name must start with one of the prefixes, a file:
    # reference must lie under one of the directories. Empty = anywhere.
    secret_env_prefixes: list[Annotated[str, msgspec.Meta(min_length=1)]] = msgspec.field(
        default_factory=list)
    secret_dirs: list[Annotated[str, msgspec.Meta(min_length=1)]] = msgspec.field(
        default_factory=list)


class KubernetesConfig(_Section, frozen=True):
    enabled: bool = False
    kubeconfig: str | None = None
    control_namespace: str = "trio-supervisor"
    apps_namespace: str = "apps"
    field_manager: str = "trio-supervisor"
    preflight_retry_s: RetrySeconds = 300.0
    # Which installation owns a child (the label on every child and part of every
    # sweep selector; None = the control namespace), the periodic resync, and the client-side
    # rate limit (a token bucket, as client-go's QPS and Burst).
    installation: Annotated[
        str, msgspec.Meta(pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
    ] | None = None
    resync_s: RetrySeconds = 600.0
    # An ``Applied`` Event per child write: off by default (a bulk create wrote one per parent).
    applied_events: bool = False
    # A safety net, not the pace: a bulk of 1,000 parents (2,000 writes) fits the burst; the
    # server's own protection (429 + Retry-After, honoured by the client) paces beyond it.
    qps: PositiveFloat = 1000.0
    burst: Annotated[int, msgspec.Meta(ge=1)] = 2000
    # Leader election for the fan-out on a coordination.k8s.io/v1 Lease
    # (controller-runtime's defaults). identity None = hostname, pid and a random suffix.
    leader_election: bool = True
    lease_name: Annotated[
        str, msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
    ] = "trio-supervisor-fanout"
    # retry_period_s < renew_deadline_s < lease_duration_s (configchecks).
    lease_duration_s: Annotated[float, msgspec.Meta(ge=1.0, le=3600.0)] = 15.0
    renew_deadline_s: Annotated[float, msgspec.Meta(ge=0.5, le=3600.0)] = 10.0
    retry_period_s: Annotated[float, msgspec.Meta(ge=0.1, le=3600.0)] = 2.0
    identity: Annotated[str, msgspec.Meta(min_length=1, max_length=128,
                                          pattern=r"^[A-Za-z0-9._:@-]+$")] | None = None

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
    hook: HookConfig = msgspec.field(default_factory=HookConfig)
    admin: AdminConfig = msgspec.field(default_factory=AdminConfig)
    kubernetes: KubernetesConfig = msgspec.field(default_factory=KubernetesConfig)
    revision: RevisionConfig = msgspec.field(default_factory=RevisionConfig)


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


def sqlite_path(url: str) -> str:
    """``sqlite:///var/cp.db`` -> ``var/cp.db``; ``sqlite:////abs/cp.db`` -> ``/abs/cp.db``."""
    return url[len("sqlite:///") :]
