"""The one rule for an alias's ``upstream``: an absolute http(s) URL with a host and no credentials.

:data:`UPSTREAM_URL` (full match) plus :func:`ipv6_ok` decide; :func:`explain_upstream`
says why a URL fails, without echoing it (it may hold credentials).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

__all__ = ["UPSTREAM_URL", "explain_upstream", "ipv6_ok"]

# An absolute http(s) URL whose authority is a host (DNS-like name, or a
# bracketed IPv6 literal) and an optional port from 1 to 65535; no userinfo, no
# whitespace or control characters anywhere. Underscores are allowed in names
# because container networks use them.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
UPSTREAM_URL: Final = re.compile(
    rf"(?i:https?)://(?:{_LABEL}(?:\.{_LABEL})*\.?|\[[0-9A-Fa-f:.]+\])"
    rf"(?::{_PORT})?(?:[/?#][^\x00-\x20\x7f]*)?"
)


def ipv6_ok(url: str) -> bool:
    """False when ``url``'s host is bracketed but not an IPv6 address."""
    authority = url.partition("://")[2]
    if not authority.startswith("["):
        return True
    try:
        ipaddress.IPv6Address(authority[1 : authority.find("]")])
    except ValueError:
        return False
    return True


def explain_upstream(url: str) -> str:
    """Why ``url`` is not an acceptable upstream. Never echoes the URL: it may hold credentials."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "must be an absolute http or https URL (scheme://host...)"
    if scheme.lower() not in ("http", "https"):
        return "must be an http or https URL"
    if re.search(r"[\x00-\x20\x7f]", url):
        return "must not contain whitespace or control characters"
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        return "must not embed credentials (user@host); give clients a key instead"
    if not authority:
        return "has no host"
    found = re.fullmatch(r"(?P<host>.*?)(?::(?P<port>[^:\]]*))?", authority)
    port = found.group("port") if found else None
    if port is not None and not re.fullmatch(_PORT, port):
        return "port must be a number from 1 to 65535 (no leading zeros)"
    return "host must be a DNS name or an IP address (IPv6 in brackets)"
