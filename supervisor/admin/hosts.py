"""Which ``Host`` and ``Origin`` the admin API answers (DNS rebinding, cross-site WebSockets).

:class:`AllowedHosts` holds the rules; the app applies them before the token.
Operators: docs/operations.md, "Security".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["AllowedHosts", "host_of", "origin_of"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("", "0.0.0.0", "::")
DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]  # scheme, host (lower-case, no brackets), port


def host_of(header: str) -> str:
    """The host part of a ``Host`` header value, lower-case, without port or final dot;
    a malformed value comes back whole (and so matches no known name)."""
    value = header.strip().lower()
    if value.startswith("["):
        # "[address]" or "[address]:port"; anything else (an unclosed bracket, a
        # name after it) is kept whole, which names nothing the server is known by.
        inside, sep, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
        if sep and (not rest or (port is not None and port.isdigit())):
            value = inside
    else:
        name, sep, port = value.rpartition(":")
        if sep and port.isdigit() and ":" not in name:
            value = name
    return value.rstrip(".")


def origin_of(value: str) -> Origin | None:
    """``scheme://host[:port]`` as (scheme, host, port), the port defaulted from the
    scheme (RFC 6454 compares all three); None when it is not such an origin
    (``null``, a path, another scheme, a malformed port)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = parts.hostname
    if scheme not in DEFAULT_PORTS or not host or parts.path or parts.query or parts.fragment:
        return None
    if parts.username is not None or parts.password is not None:
        return None
    return (scheme, host.rstrip("."), DEFAULT_PORTS[scheme] if port is None else port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class AllowedHosts:
    """The names and origins the server answers to; browsers send both headers truthfully.

    A page the operator opens can make the browser call the admin API.
    DNS rebinding re-points an attacker's name at 127.0.0.1: ``Host: evil.example``.
    A cross-site WebSocket carries ``Origin: http://evil.example``; same-origin does not cover it.
    The app answers a foreign ``Host`` 421 and a foreign ``Origin`` 403.
    ``/healthz`` skips the Host check: it reveals nothing, and probes send the pod IP.
    """

    def __init__(
        self,
        listen_host: str,
        extra: Iterable[str] = (),
        *,
        port: int | None = None,
        scheme: str = "http",
        origins: Iterable[str] = (),
    ) -> None:
        from supervisor.config import is_loopback

        # None (no listener: tests of the app alone): any port of the own scheme.
        self.port = port
        self.scheme = scheme
        self.origins = frozenset(o for o in map(origin_of, origins) if o is not None)

        names = {e.strip().lower().rstrip(".") for e in extra if e.strip()}
        self.any = "*" in names
        self.suffixes = tuple(n for n in names if n.startswith("."))
        host = listen_host.strip("[]").lower()
        if host not in WILDCARDS:
            names.add(host)
        if host in WILDCARDS or is_loopback(host):
            names.update(LOOPBACK_NAMES)
        self.names = frozenset(n for n in names if not n.startswith("."))
        self.any_address = host in WILDCARDS

    def allows(self, host: str) -> bool:
        """Whether ``host`` (no port) is a name the server is known by.

        Known: the listen address; ``localhost``, ``127.0.0.1`` and ``::1`` on a loopback
        or wildcard (``0.0.0.0``/``::``) listener; every ``[admin].allowed_hosts`` entry.
        An entry is a name, an address, ``.example.com`` (and subdomains) or ``*``.
        On a wildcard listener any IP address passes: DNS rebinding needs a name.
        (Prometheus and probes address pods by IP.)
        """
        if self.any or host in self.names:
            return True
        if self.any_address and _is_ip(host):
            return True
        return any(host.endswith(s) or host == s[1:] for s in self.suffixes)

    def allows_host_header(self, header: str | None) -> bool:
        """:meth:`allows` on the header's host; no ``Host`` (HTTP/1.0, never a browser) passes."""
        return header is None or self.allows(host_of(header))

    def allows_origin(self, origin: str | None) -> bool:
        """Whether a WebSocket handshake or a ``POST`` from ``origin`` may proceed.

        ``POST`` because a cross-site page sends a simple POST without a CORS preflight.
        Own origin: the listener's scheme and bound port, with a host :meth:`allows`.
        Another port of the same host is another origin: any local program could drive us.
        ``[admin].allowed_origins`` entries (``scheme://host[:port]``) pass besides.
        ``null`` and anything malformed are refused; no ``Origin`` (a non-browser) passes.
        """
        if origin is None:
            return True
        parsed = origin_of(origin)
        if parsed is None:
            return False
        if parsed in self.origins:
            return True
        scheme, host, port = parsed
        if scheme != self.scheme or (self.port is not None and port != self.port):
            return False
        return self.allows(host)
