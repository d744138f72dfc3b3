"""What every command's ``--json`` shares: the failure document and how a Struct is printed.

Each command declares what it prints as msgspec Structs (beside the command)
and prints one with :func:`print_json`. The text is the standard library's
JSON of the Struct's builtins (``", "`` and ``": "`` between items, non-ASCII
escaped), so it is the same on every terminal whatever its encoding.
"""

from __future__ import annotations

import json
from typing import Literal

import msgspec

__all__ = ["Failure", "json_text", "print_json"]


class Failure(msgspec.Struct, kw_only=True):
    """``{"ok": false, "reason", "detail"}``: a command refused or failed before its answer."""

    ok: Literal[False] = False
    reason: str
    detail: str


def json_text(value: object, *, indent: int | None = None) -> str:
    """``value`` (a Struct, or builtins holding Structs) as JSON text."""
    return json.dumps(msgspec.to_builtins(value), indent=indent)


def print_json(value: object, *, indent: int | None = None, flush: bool = False) -> None:
    print(json_text(value, indent=indent), flush=flush)
