"""Bearer-token authentication of the admin API: the full token and the read token.

Operators: docs/admin-api.md (which routes need which token).
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

    Read by :func:`supervisor.tokenfile.read_token`: an unusable file is a ConfigError on its key.
    A read token equal to the full one is a :class:`ConfigError`: its holder could
    ``POST /v1/converge``, which the read token exists to refuse.
    """
    token = read_token(token_file, TOKEN_PATH) if token_file else None
    read = read_token(read_token_file, READ_TOKEN_PATH) if read_token_file else None
    if read is not None and read == token:
        raise ConfigError(READ_TOKEN_PATH, f"{read_token_file} holds the same token as "
                          "admin.token_file (it would pass POST /v1/converge): use another")
    return token, read


async def reread_tokens(token_file: str | None, read_token_file: str | None, *,
                        timeout_s: float) -> tuple[str | None, str | None] | None:
    """:func:`admin_tokens` again (SIGHUP), in a thread within ``timeout_s``; None (logged)
    when a file is unusable or the read does not finish (a FIFO, a hung mount).

    New tokens replace the old, refused from then on; on None both old ones stay in force.
    """
    try:
        tokens = await in_thread(partial(admin_tokens, token_file, read_token_file),
                                 dependency="reload", deadline_s=timeout_s,
                                 what="reading the token files")
    except (ConfigError, ThreadDeadline) as exc:
        log.error("SIGHUP: tokens not reloaded; the previous tokens stay in force", error=str(exc))
        return None
    log.info("SIGHUP: tokens reloaded", token_file=token_file,
             read_token_file=read_token_file)
    return tokens


def authorized(headers: Iterable[tuple[bytes, bytes]], token: str) -> bool:
    """True when ``headers`` (ASGI: lower-case names) carry exactly ``Bearer <token>``.

    :func:`hmac.compare_digest`: the time taken does not depend on the bytes matched.
    Exactly one ``Authorization`` header: a proxy and a client may disagree on two.
    """
    values = [value for name, value in headers if name.lower() == b"authorization"]
    if len(values) != 1:
        return False
    scheme, _, credentials = values[0].strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(credentials.strip(), token.encode("ascii"))
