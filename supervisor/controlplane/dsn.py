"""Keeping the control-plane password out of logs, status and exception messages.

Contract (CONTRACT.md section 1): no secret value ever appears in a log line.
The DSN is the one secret the store holds, so everything that prints a URL
prints :func:`redact` of it, and every driver message that is wrapped into a
:class:`~supervisor.controlplane.store.ControlPlaneError` first goes through
:func:`scrub`, in case a driver echoes connection parameters back.

Both URL (``postgresql://user:secret@host/db?password=...``) and key/value
(``host=h password='se cret'``) spellings are handled. Pure string work; no
driver import, so the CLI can redact without loading psycopg.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

__all__ = ["MASK", "passwords", "redact", "scrub"]

MASK = "***"

# user:password@ in the authority of a URL (the password may be empty).
_URL_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:?#]*):(?P<pw>[^@/?#]*)@")
# password=... as a query parameter of a URL.
_URL_QUERY = re.compile(r"(?P<head>[?&]password=)(?P<pw>[^&#]*)", re.IGNORECASE)
# password=value or password = 'quoted \' value' in a key/value conninfo string.
_KV = re.compile(
    r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|[^\s']\S*)", re.IGNORECASE
)


def _is_url(dsn: str) -> bool:
    return "://" in dsn.split(" ", 1)[0]


def redact(url: str) -> str:
    """``url`` with every password replaced by ``***``; anything else unchanged."""
    if _is_url(url):
        url = _URL_USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", url, count=1)
        return _URL_QUERY.sub(lambda m: f"{m['head']}{MASK}", url)
    return _KV.sub(lambda m: f"{m['head']}{MASK}", url)


def passwords(url: str) -> list[str]:
    """Every spelling of the password(s) in ``url`` (raw and percent-decoded)."""
    found: list[str] = []
    if _is_url(url):
        try:
            raw = urlsplit(url).password
        except ValueError:
            raw = None
        match = _URL_USERINFO.match(url)
        if match and match["pw"]:
            found.append(match["pw"])
        if raw:
            found.append(raw)
        found.extend(m["pw"] for m in _URL_QUERY.finditer(url) if m["pw"])
    else:
        for m in _KV.finditer(url):
            value = m["pw"]
            if value.startswith("'") and value.endswith("'") and len(value) >= 2:
                found.append(value)
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            if value:
                found.append(value)
    decoded = [unquote(p) for p in found]
    # Longest first, so a password that contains another spelling is masked whole.
    return sorted({p for p in [*found, *decoded] if p}, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's message, say) with ``url``'s password masked wherever it appears."""
    if url and url in text:
        text = text.replace(url, redact(url))
    for secret in passwords(url):
        text = text.replace(secret, MASK)
    return text
