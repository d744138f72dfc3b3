"""Which ``Host`` and ``Origin`` the admin API answers (DNS rebinding, cross-site WebSockets).

A web page the operator opens can make the browser send requests to the admin
API: through DNS rebinding (a name the attacker controls, re-pointed at
127.0.0.1, so the request carries ``Host: evil.example``) or through a
cross-site WebSocket (``Origin: http://evil.example``; the same-origin policy
does not cover WebSockets). Browsers always send these headers truthfully, so:

- a request whose ``Host`` (port ignored) is not a name the server is known by
  is answered 421 Misdirected Request. Known: the listen address itself; the
  loopback names ``localhost``, ``127.0.0.1`` and ``::1`` when the listener is
  loopback or a wildcard (``0.0.0.0``/``::``, which includes loopback); and
  every entry of ``[admin].allowed_hosts`` (a name, an address, ``.example.com``
  for that domain and its subdomains, or ``*`` for any); and, on a wildcard
  listener (whose addresses the server cannot enumerate), any IP address: DNS
  rebinding needs a name, so an address in ``Host`` is not one (Prometheus and
  probes address pods by IP). A request without
  ``Host`` (HTTP/1.0, never a browser) passes.
- a WebSocket handshake, or a ``POST`` (``/v1/converge``: a cross-site page can
  send a simple POST without a CORS preflight), whose ``Origin`` names a host
  not known the same way (or is ``null``) is refused with 403. Without
  ``Origin`` (``watch``, ``curl``, any non-browser client) it passes.

``/healthz`` is exempt from the Host check: it reveals nothing, and probes
(Kubernetes' ``httpGet`` sends the pod IP as Host) must reach it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["AllowedHosts", "host_of"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("", "0.0.0.0", "::")


def host_of(header: str) -> str:
    """The host part of a ``Host`` header value, lower-case, without port or final dot."""
    value = header.strip().lower()
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else value[1:]
    else:
        name, sep, port = value.rpartition(":")
        if sep and port.isdigit() and ":" not in name:
            value = name
    return value.rstrip(".")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class AllowedHosts:
    """The names the server answers to; see the module docstring."""

    def __init__(self, listen_host: str, extra: Iterable[str] = ()) -> None:
        from supervisor.config import is_loopback

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
        if self.any or host in self.names:
            return True
        if self.any_address and _is_ip(host):
            return True
        return any(host.endswith(s) or host == s[1:] for s in self.suffixes)

    def allows_host_header(self, header: str | None) -> bool:
        return header is None or self.allows(host_of(header))

    def allows_origin(self, origin: str | None) -> bool:
        if origin is None:
            return True
        try:
            host = urlsplit(origin.strip()).hostname
        except ValueError:
            return False
        return host is not None and self.allows(host.rstrip("."))
