"""The configuration file (TOML), its environment overrides, and ``check``.

Contract (CONTRACT.md section 3): unknown keys are errors; every key can be
overridden from the environment as ``SUPERVISOR_<SECTION>__<KEY>``; an invalid
file is refused with the JSON-path of the bad key and the reason, which the
CLI turns into exit 2.

Environment values are parsed as TOML values when they parse (so
``["a", "b"]`` is a list and ``2.5`` a float) and taken as plain strings
otherwise (so ``postgresql://...`` needs no quoting); msgspec's lax conversion
then turns ``"true"`` or ``"5"`` into the declared type.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

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
    "load",
    "load_text",
]

ENV_PREFIX = "SUPERVISOR_"
CONFIG_ENV = "SUPERVISOR_CONFIG"

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]

LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


class SupervisorConfig(_Section, frozen=True):
    shutdown_grace_s: PositiveFloat = 10.0
    restart_intensity: NonNegativeInt = 5
    restart_period_s: PositiveFloat = 60.0


class LogConfig(_Section, frozen=True):
    level: LogLevel = "info"
    format: Literal["auto", "json", "console"] = "auto"


class ControlPlaneConfig(_Section, frozen=True):
    url: str = "sqlite:///var/controlplane.db"
    poll_interval_s: PositiveFloat = 5.0
    listen: bool = True
    channel: Annotated[str, msgspec.Meta(pattern=r"^[a-z_][a-z0-9_]{0,62}$")] = (
        "supervisor_desired"
    )
    max_revision_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16 * 1024 * 1024
    backoff_initial_s: PositiveFloat = 0.25
    backoff_max_s: PositiveFloat = 30.0

    @property
    def backend(self) -> Literal["postgresql", "sqlite"]:
        return "sqlite" if self.url.startswith("sqlite:") else "postgresql"


class CacheConfig(_Section, frozen=True):
    path: str | None = None
    signing_key: str | None = None
    trusted_keys: list[str] = msgspec.field(default_factory=list)


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
    # Where a revision's secret references may point (CONTRACT section 8): an
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
    preflight_retry_s: PositiveFloat = 300.0


class Config(_Section, frozen=True):
    supervisor: SupervisorConfig = msgspec.field(default_factory=SupervisorConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    control_plane: ControlPlaneConfig = msgspec.field(default_factory=ControlPlaneConfig)
    cache: CacheConfig = msgspec.field(default_factory=CacheConfig)
    snapshot: SnapshotConfig = msgspec.field(default_factory=SnapshotConfig)
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


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    sections = set(Config.__struct_fields__)
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name or name == CONFIG_ENV:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("__")
        section, key = section.lower(), key.lower()
        if section not in sections:
            raise ConfigError(f"$.{section}", f"unknown section (from environment {name})")
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"$.{section}", "expected a table")
        table[key] = _env_value(value)
    return raw


def _cross_check(config: Config) -> None:
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
    if not (cp.url.startswith(("postgresql://", "postgres://")) or cp.url.startswith("sqlite:///")):
        raise ConfigError(
            "$.control_plane.url", "expected postgresql://... or sqlite:///PATH"
        )
    if cp.backend == "postgresql":
        from supervisor.controlplane.dsn import problem

        why = problem(cp.url)
        if why is not None:
            # The reason names the rule, never the value: the DSN holds a password.
            raise ConfigError("$.control_plane.url", why)
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


def load_text(
    text: str, *, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> Config:
    """Parse TOML text, apply environment overrides, validate. Raises ConfigError."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("$", f"not valid TOML: {exc}", source=source) from exc
    try:
        raw = _apply_env(raw, os.environ if environ is None else environ)
        try:
            config = msgspec.convert(raw, Config, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(*_split_msgspec_error(str(exc))) from exc
        _cross_check(config)
    except ConfigError as exc:
        exc.source = source
        exc.args = (f"{source}: {exc.path}: {exc.reason}",)
        raise
    return config


def load(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate the configuration file at ``path``. Raises ConfigError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("$", f"cannot read: {exc}", source=str(path)) from exc
    return load_text(text, source=str(path), environ=environ)


def _split_msgspec_error(message: str) -> tuple[str, str]:
    # msgspec says "Object contains unknown field `x` - at `$.log`"
    # or "Expected `int`, got `str` - at `$.a.b`".
    reason, sep, where = message.rpartition(" - at `")
    if sep:
        path = where.rstrip("`")
    else:
        reason, path = message, "$"
    if reason.startswith("Object contains unknown field `"):
        field = reason.split("`")[1]
        return f"{path}.{field}", "unknown key"
    return path, reason


def check_files(config: Config) -> list[tuple[str, str]]:
    """Check the files the configuration names; return (path, problem) pairs."""
    problems: list[tuple[str, str]] = []

    def readable(key: str, value: str | None) -> None:
        if value is not None and not os.access(value, os.R_OK):
            problems.append((key, f"cannot read {value}"))

    def parent_writable(key: str, value: str | None) -> None:
        if value is None:
            return
        parent = Path(value).parent
        if not parent.is_dir():
            problems.append((key, f"directory {parent} does not exist"))
        elif not os.access(parent, os.W_OK):
            problems.append((key, f"directory {parent} is not writable"))

    readable("$.admin.token_file", config.admin.token_file)
    readable("$.cache.signing_key", config.cache.signing_key)
    readable("$.kubernetes.kubeconfig", config.kubernetes.kubeconfig)
    parent_writable("$.cache.path", config.cache.path)
    parent_writable("$.snapshot.path", config.snapshot.path)
    if config.control_plane.backend == "sqlite":
        parent_writable("$.control_plane.url", sqlite_path(config.control_plane.url))
    return problems


def sqlite_path(url: str) -> str:
    """``sqlite:///var/cp.db`` -> ``var/cp.db``; ``sqlite:////abs/cp.db`` -> ``/abs/cp.db``."""
    return url[len("sqlite:///") :]
