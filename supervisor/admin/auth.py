"""Bearer-token authentication of the admin API.

Contract (docs/admin-api.md): when ``[admin].token_file`` is set, every
route but ``/healthz`` requires ``Authorization: Bearer <token>``. The token of
``[admin].read_token_file`` (a follower's, a dashboard's) is accepted on the
``GET``/``HEAD`` routes and the stream only: ``POST /v1/converge`` answers it 403.

- :func:`admin_tokens` reads both files at start
  (:func:`supervisor.tokenfile.read_token`: an unusable file is a
  :class:`ConfigError` on its key), and refuses a read token equal to the full
  one (``$.admin.read_token_file``). :func:`reread_tokens` reads them again for
  SIGHUP, off the event loop and within a deadline: the new tokens replace the
  old ones (refused from then on), or, when either file is unusable, both old
  ones stay in force.
- :func:`authorized` compares with :func:`hmac.compare_digest`, so the time it
  takes does not depend on how many leading bytes matched. Exactly one
  ``Authorization`` header is accepted: two are ambiguous (a proxy and a
  client may disagree on which one counts), so they are refused.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from functools import partial

from supervisor.errors import ConfigError
from supervisor.logs import get_logger
from supervisor.threads import ThreadDeadline, in_thread
from supervisor.tokenfile import read_token

__all__ = ["WWW_AUTHENTICATE", "admin_tokens", "authorized", "reread_tokens"]

log = get_logger("admin")

TOKEN_PATH = "$.admin.token_file"
READ_TOKEN_PATH = "$.admin.read_token_file"
WWW_AUTHENTICATE = b'Bearer realm="trio-supervisor"'


def admin_tokens(token_file: str | None,
                 read_token_file: str | None) -> tuple[str | None, str | None]:
    """The full token and the read token of ``[admin]`` (None where no file is set).
    A read token equal to the full one is a :class:`ConfigError`: its holder could
    ``POST /v1/converge``, which the read token exists to refuse."""
    token = read_token(token_file, TOKEN_PATH) if token_file else None
    read = read_token(read_token_file, READ_TOKEN_PATH) if read_token_file else None
    if read is not None and read == token:
        raise ConfigError(READ_TOKEN_PATH, f"{read_token_file} holds the same token as "
                          "admin.token_file (it would pass POST /v1/converge): use another")
    return token, read


async def reread_tokens(token_file: str | None, read_token_file: str | None, *,
                        timeout_s: float) -> tuple[str | None, str | None] | None:
    """:func:`admin_tokens` again (SIGHUP), in a thread within ``timeout_s``; None (logged)
    when a file is unusable or the read does not finish (a FIFO, a hung mount)."""
    try:
        tokens = await in_thread(partial(admin_tokens, token_file, read_token_file),
                                 dependency="reload", deadline_s=timeout_s,
                                 what="reading the token files")
    except (ConfigError, ThreadDeadline) as exc:
        error = str(exc)
    else:
        log.info("SIGHUP: tokens reloaded", token_file=token_file,
                 read_token_file=read_token_file)
        return tokens
    log.error("SIGHUP: tokens not reloaded; the previous tokens stay in force", error=error)
    return None


def authorized(headers: Iterable[tuple[bytes, bytes]], token: str) -> bool:
    """True when ``headers`` (ASGI: lower-case names) carry exactly ``Bearer <token>``."""
    values = [value for name, value in headers if name.lower() == b"authorization"]
    if len(values) != 1:
        return False
    scheme, _, credentials = values[0].strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(credentials.strip(), token.encode("ascii"))
