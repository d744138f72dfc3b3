"""Bearer-token authentication of the admin API.

Contract (docs/admin-api.md): when ``[admin].token_file`` is set, every
route but ``/healthz`` requires ``Authorization: Bearer <token>``. The token of
``[admin].read_token_file`` (a follower's, a dashboard's) is accepted on the
``GET``/``HEAD`` routes and the stream only: ``POST /v1/converge`` answers it 403.

- :func:`read_token` reads the file once at start: surrounding whitespace is
  stripped (files end with a newline); an unreadable or empty file, or a token
  that could not travel in one header value, is a :class:`ConfigError` on
  ``$.admin.token_file``. The token itself never appears in a message.
- :func:`admin_tokens` reads both files, and refuses a read token equal to the
  full one (``$.admin.read_token_file``).
- :func:`authorized` compares with :func:`hmac.compare_digest`, so the time it
  takes does not depend on how many leading bytes matched. Exactly one
  ``Authorization`` header is accepted: two are ambiguous (a proxy and a
  client may disagree on which one counts), so they are refused.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from pathlib import Path

from supervisor.errors import ConfigError

__all__ = ["WWW_AUTHENTICATE", "admin_tokens", "authorized", "read_token"]

TOKEN_PATH = "$.admin.token_file"
READ_TOKEN_PATH = "$.admin.read_token_file"
WWW_AUTHENTICATE = b'Bearer realm="trio-supervisor"'


def read_token(path: str, where: str = TOKEN_PATH) -> str:
    """The bearer token stored in ``path``, stripped of surrounding whitespace;
    errors name ``where`` (the configuration key)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(where, f"{path} is not UTF-8 text") from exc
    except OSError as exc:
        raise ConfigError(where, f"cannot read {path}: {exc.strerror or exc}") from exc
    token = text.strip()
    if not token:
        raise ConfigError(where, f"{path} is empty")
    # RFC 6750 tokens are printable ASCII without spaces; anything else would be
    # mangled by some HTTP client or proxy on the way, and fail in confusing ways.
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise ConfigError(where, f"{path} must hold one token of printable ASCII without spaces")
    return token


def admin_tokens(token_file: str | None,
                 read_token_file: str | None) -> tuple[str | None, str | None]:
    """The full token and the read token of ``[admin]`` (None where no file is set).
    A read token equal to the full one is a :class:`ConfigError`: its holder could
    ``POST /v1/converge``, which the read token exists to refuse."""
    token = read_token(token_file) if token_file else None
    read = read_token(read_token_file, READ_TOKEN_PATH) if read_token_file else None
    if read is not None and read == token:
        raise ConfigError(READ_TOKEN_PATH, f"{read_token_file} holds the same token as "
                          "admin.token_file (it would pass POST /v1/converge): use another")
    return token, read


def authorized(headers: Iterable[tuple[bytes, bytes]], token: str) -> bool:
    """True when ``headers`` (ASGI: lower-case names) carry exactly ``Bearer <token>``."""
    values = [value for name, value in headers if name.lower() == b"authorization"]
    if len(values) != 1:
        return False
    scheme, _, credentials = values[0].strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(credentials.strip(), token.encode("ascii"))
