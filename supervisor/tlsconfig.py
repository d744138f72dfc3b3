"""TLS contexts between replicas: the admin API's server side and the follower's client side.

A file unreadable, or not holding what it should, is a ConfigError naming its key. ``check``
and a start exit 2, never with a traceback.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from functools import partial

from supervisor.config import ControlPlaneConfig
from supervisor.errors import ConfigError
from supervisor.logs import get_logger

__all__ = ["ServerContexts", "client_context", "server_context", "upstream_context"]

log = get_logger("daemon")

ALPN = ["http/1.1"]


def _load(load: Callable[[], None], files: dict[str, str], where: str, what: str) -> None:
    """Run ``load``. A file it cannot read is a ConfigError on that file's key (``files``: path
    -> key). Anything else is one on ``where``, saying ``what`` it should be.
    """
    try:
        load()
    except (FileNotFoundError, PermissionError) as exc:
        first = next(iter(files))
        missing = exc.filename or first
        why = "no such file" if isinstance(exc, FileNotFoundError) else "permission denied"
        key = files.get(missing, files[first])
        raise ConfigError(key, f"cannot read {missing}: {why}") from exc
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(where, f"{what} ({exc.strerror or exc})") from exc


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str,
                cert_where: str, key_where: str) -> None:
    _load(partial(context.load_cert_chain, cert_file, key_file),
          {cert_file: cert_where, key_file: key_where}, cert_where,
          f"{cert_file} and {key_file} are not a PEM certificate chain and its private key")


def _load_ca(context: ssl.SSLContext, ca_file: str, where: str) -> None:
    _load(partial(context.load_verify_locations, cafile=ca_file), {ca_file: where}, where,
          f"{ca_file} holds no PEM CA certificate")


def server_context(cert_file: str, key_file: str, client_ca_file: str | None = None,
                   ) -> ssl.SSLContext:
    """The admin API's server context, from ``[admin].tls_cert_file`` and ``tls_key_file``.

    TLS 1.2 or later, ``http/1.1`` alone over ALPN, no renegotiation. With
    ``[admin].client_ca_file`` every client must present a certificate that CA signed.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # A client renegotiating TLS 1.2 over and over costs a handshake each time:
    # refused, whatever the OpenSSL underneath defaults to (before 3.0: accepted).
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(ALPN)
    _load_chain(context, cert_file, key_file, "$.admin.tls_cert_file", "$.admin.tls_key_file")
    if client_ca_file is not None:
        _load_ca(context, client_ca_file, "$.admin.client_ca_file")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    *,
    where: str = "$.control_plane",
) -> ssl.SSLContext:
    """A client context verifying the server against ``ca_file`` (None: the system's
    trust store), presenting ``cert_file``/``key_file`` when given. ``where`` is the
    configuration section errors name (``$.control_plane``, or ``--ca-file``)."""
    context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(ALPN)
    if ca_file is not None:
        _load_ca(context, ca_file, f"{where}.ca_file" if where.startswith("$") else where)
    if cert_file is not None and key_file is not None:
        _load_chain(context, cert_file, key_file, f"{where}.client_cert_file",
                    f"{where}.client_key_file")
    return context


def upstream_context(config: ControlPlaneConfig) -> ssl.SSLContext | None:
    """What a follower verifies its upstream with, over https: ``[control_plane].ca_file``
    (else the system's trust store) and the client certificate it presents; None
    over plain http."""
    if not config.url.startswith("https://"):
        return None
    return client_context(config.ca_file, config.client_cert_file, config.client_key_file)


class ServerContexts:
    """The admin server's TLS context in force; :meth:`reload` swaps it (SIGHUP).

    Each new handshake takes the context of its moment. So a renewed short-lived
    certificate is served without a restart; open connections keep theirs.
    """

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str | None) -> None:
        self._files = (cert_file, key_file, client_ca_file)
        self._current = server_context(*self._files)
        self.reloads = 0

    def current(self) -> ssl.SSLContext:
        return self._current

    def reload(self) -> None:
        """SIGHUP: build the context again from the same files; when they no longer
        load, the one in force stays (logged, with why)."""
        try:
            self._current = server_context(*self._files)
        except ConfigError as exc:
            log.error("SIGHUP: admin TLS certificate not reloaded; the previous one stays",
                      key=exc.path, error=exc.reason)
            return
        self.reloads += 1
        log.info("SIGHUP: admin TLS certificate reloaded", reloads=self.reloads)
