"""Bearer token files: ``[admin].token_file``, ``read_token_file``, ``[control_plane].token_file``.

:func:`read_token` is the one reader of all three.
"""

from __future__ import annotations

from typing import Final

from supervisor.bounds import PATH_BYTES, shown
from supervisor.errors import ConfigError

__all__ = ["MAX_TOKEN_FILE_BYTES", "read_token"]

MAX_TOKEN_FILE_BYTES: Final = 4096
_ASCII_WHITESPACE = " \t\n\r\f\v"


def read_token(path: str, where: str) -> str:
    """The bearer token stored in ``path``; errors name ``where`` (the configuration key).

    One token of printable ASCII without spaces, surrounding ASCII whitespace stripped.
    RFC 6750: anything else is mangled by some client or proxy, or cannot go in a header.
    Each error is a :class:`~supervisor.errors.ConfigError` on ``where``: ``check`` and a
    start exit 2. It names the file, never its content; the name is quoted and cut
    unless it is one printable line of at most :data:`~supervisor.bounds.PATH_BYTES`.
    Refused:

    - a file that cannot be read (a path holding a NUL, or a surrogate that is no byte);
    - a file that is not UTF-8 text;
    - more than :data:`MAX_TOKEN_FILE_BYTES` bytes. At most one byte more is read:
      naming a large file costs nothing, and a longer token is never cut to one refused;
    - an empty one, any character but printable ASCII, or whitespace inside.
    """
    name = shown(path, PATH_BYTES)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL, a surrogate that is no byte
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(where, f"cannot read {name}: {reason}") from exc
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ConfigError(where, f"{name} holds more than {MAX_TOKEN_FILE_BYTES} bytes: a "
                          "token file holds one token (is it the right file?)")
    try:
        token = data.decode("utf-8").strip(_ASCII_WHITESPACE)
    except UnicodeDecodeError as exc:
        raise ConfigError(where, f"cannot read {name}: it is not UTF-8 text") from exc
    if not token:
        raise ConfigError(where, f"{name} is empty")
    if not all("!" <= c <= "~" for c in token):
        raise ConfigError(where, f"{name} must hold one token of printable ASCII without spaces")
    return token
