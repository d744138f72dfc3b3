"""Keeping the control-plane passwords (``password``, ``sslpassword``) out of logs and errors.

No secret value ever appears in a log line (docs/log-events.md), stdout, status or exceptions.
One redaction, on libpq's own parser (``psycopg.conninfo.conninfo_to_dict``): URL and
key/value spellings read exactly as the driver reads them. :func:`describe` shows a DSN,
:func:`scrub` masks its secrets in any text, :func:`problem` says why one is unusable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from supervisor.bounds import shown

__all__ = ["MASK", "credential_files", "describe", "problem", "redact", "scrub", "secrets"]

MASK = "***"
SECRET_KEYS = ("password", "sslpassword")
# Pieces of a misread password shorter than this are not masked on their own:
# masking every "a" of a message would destroy it and protect nothing.
MIN_PIECE = 4
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# The user (up to the first ":"), then the password up to the last "@" (greedy).
_SPELLED_PASSWORD = re.compile(_SCHEME.pattern + r"[^:]*:(.+)@", re.S)
_PIECE_SPLIT = re.compile(r"[@/?#:&=]")
_KV_SECRET = re.compile(r"password\s*=\s*(.*?)(?=\s+[A-Za-z_]+\s*=|$)", re.S)
_URL_SECRET = re.compile(r"[?&](?:ssl)?password=(.+)$", re.S)
_QUERY_SPLIT = re.compile(r"[&=#]")


def _is_url(dsn: str) -> bool:
    return bool(_SCHEME.match(dsn))


def _parse(dsn: str) -> dict[str, str] | None:
    try:
        params = conninfo_to_dict(dsn)
    except (psycopg.Error, UnicodeEncodeError):  # a lone surrogate: a byte not UTF-8
        return None
    return {k: str(v) for k, v in params.items() if v is not None}


def _unknown_parameter(dsn: str) -> str | None:
    """``unknown connection parameter `sslmod` (did you mean `sslmode`?)`` for a URL query
    or a ``key=value`` word that libpq does not know; None when every name is known."""
    import difflib

    known = [o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults()]
    if _is_url(dsn):
        try:
            names = [k for k, _ in parse_qsl(urlsplit(dsn).query, keep_blank_values=True)]
        except ValueError:
            return None
    else:
        names = [word.partition("=")[0].strip() for word in dsn.split() if "=" in word]
    for name in names:
        if name and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            # The parameter's name only: its value may be a secret. One that is no
            # short printable word is quoted with escapes and cut.
            return f"unknown connection parameter `{shown(name)}`{hint}"
    return None


def _spelled_password(dsn: str) -> str | None:
    """The URL's password as written: after the user's ``:``, up to the last ``@``."""
    match = _SPELLED_PASSWORD.match(dsn)
    return match[1] if match else None


def describe(dsn: str) -> str:
    """``postgresql://USER@HOST:PORT/DBNAME`` of ``dsn``: only those four, when set.

    What any message shows of a DSN (also :func:`redact`): no password, no other parameter.
    A DSN the parser refuses is shown as ``postgresql://<unparseable>``.
    """
    if dsn.startswith("sqlite:"):
        return dsn  # a path: nothing secret in it
    params = _parse(dsn)
    if params is None or problem(dsn) is not None:
        return "postgresql://<unparseable>"
    user, port, dbname = params.get("user"), params.get("port"), params.get("dbname")
    return ("postgresql://" + (f"{quote(user, safe='')}@" if user else "")
            + (params.get("host") or params.get("hostaddr") or "") + (f":{port}" if port else "")
            + (f"/{quote(dbname, safe='')}" if dbname else ""))


redact = describe


def problem(dsn: str) -> str | None:
    """Why ``dsn`` cannot be used as written; None when libpq reads it as spelled.

    libpq refuses it, or reads its URL password otherwise than spelled
    (percent-encode ``@`` and ``/``). ``check`` and the configuration loader refuse
    such a DSN, naming the key, never the value.
    """
    if dsn.startswith("sqlite:"):
        return None
    params = _parse(dsn)
    if params is None:
        return _unknown_parameter(dsn) or ("libpq cannot parse this DSN (in a URL, "
                                           "percent-encode the password's special characters)")
    spelled = _spelled_password(dsn)
    if spelled is not None:
        try:
            decoded = unquote(spelled, errors="strict")
        except UnicodeDecodeError:
            decoded = spelled
        if params.get("password") != decoded:
            return ("libpq reads the password differently than it is written: "
                    "percent-encode '@' as %40 and '/' as %2F in a URL's password")
    return None


def secrets(dsn: str) -> list[str]:
    """Every spelling of the DSN's secrets to mask, longest first.

    The parsed values, their percent-encoded forms, and the raw text of the URL's password.
    Also the pieces libpq may read as another field, when the password holds a bare ``@``
    or ``/`` (then, say, ``failed to resolve host "Wb14@127.0.0.1"``).
    In key/value text libpq cannot parse: what follows ``password=`` up to the next keyword,
    whole and word by word. libpq echoes the word it choked on (``missing "=" after "..."``).
    In a URL query libpq cannot parse: what follows ``password=`` or ``sslpassword=``.
    """
    found: set[str] = set()
    params = _parse(dsn) or {}
    misread = problem(dsn) is not None
    for key in SECRET_KEYS:
        value = params.get(key)
        # A misread password is only a piece of the real one: short pieces are
        # left alone (see MIN_PIECE), the spelled password below covers them.
        if value and (not misread or len(value) >= MIN_PIECE):
            found.update({value, quote(value, safe=""), quote(value)})
    spelled = _spelled_password(dsn)
    if spelled:
        found.update({spelled, unquote(spelled)})
        # Misread: libpq may have taken pieces of it for a host or a database.
        found.update(p for p in _PIECE_SPLIT.split(spelled) if len(p) >= MIN_PIECE)
    if not params and _is_url(dsn):
        # An unparseable URL query: libpq echoes the parameter it choked on, often
        # a piece of an unencoded (ssl)password: everything after it is masked,
        # whole and piece by piece (the query's own separators).
        for match in _URL_SECRET.finditer(dsn):
            found.add(match[1])
            found.update(p for p in _QUERY_SPLIT.split(match[1]) if len(p) >= MIN_PIECE)
    elif not params:
        # Unparseable key/value text: libpq's error echoes the word it choked on,
        # often a piece of an unquoted password. Mask everything from password=
        # (or sslpassword=) up to the next keyword=, whole and word by word.
        for match in _KV_SECRET.finditer(dsn):
            value = match[1].strip()
            found.update({value, value.strip("'")})
            words = (w.strip("'") for w in value.split())
            found.update(w for w in words if len(w) >= MIN_PIECE)  # see MIN_PIECE
    return sorted((s for s in found if s), key=len, reverse=True)


def credential_files(dsn: str, environ: Mapping[str, str]) -> list[str]:
    """The files libpq reads credentials from for ``dsn``: its password file and client key.

    Each from the DSN, else ``PGPASSFILE`` / ``PGSSLKEY``, else libpq's default under ``$HOME``.
    """
    params = _parse(dsn) or {}
    home = environ.get("HOME") or os.path.expanduser("~")
    return [params.get(key) or environ.get(env) or os.path.join(home, default)
            for key, env, default in (("passfile", "PGPASSFILE", ".pgpass"),
                                      ("sslkey", "PGSSLKEY", ".postgresql/postgresql.key"))]


def scrub(text: str, dsn: str) -> str:
    """``text`` with ``dsn`` shown as :func:`describe` and every secret spelling masked.

    For any text: a driver's error, libpq's own message. The spellings are :func:`secrets`.
    """
    if dsn and dsn in text:
        text = text.replace(dsn, describe(dsn))
    for secret in secrets(dsn):
        text = text.replace(secret, MASK)
    return text
