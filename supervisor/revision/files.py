"""Revision document files (TOML or JSON) as ``publish`` reads them: :func:`load_document_file`.

The same rules a replica applies to the body (:func:`.document.document_from_object`).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Final

from supervisor import reasons
from supervisor.revision.document import (
    RevisionDocument,
    decode_body,
    document_from_object,
    encode_document,
)
from supervisor.revision.errors import RevisionError

__all__ = ["load_document_file"]


def load_document_file(path: str | os.PathLike[str],
                       raw: bytes | None = None) -> tuple[int, bytes]:
    """Read (unless ``raw`` holds its bytes already) and fully validate a TOML or JSON
    revision document file.

    ``.toml`` files are TOML, ``.json`` files JSON; any other name is JSON when
    its first non-blank byte is ``{`` and TOML otherwise. Returns
    ``(schema_version, canonical body)`` (see :func:`encode_document`); the body
    is what ``publish`` stores. Refusals are :class:`RevisionError` (``corrupt``,
    ``incompatible``, ``validation``) whose detail starts with the file name.
    """
    where = os.fspath(path)
    try:
        raw = Path(where).read_bytes() if raw is None else raw
    except OSError as exc:
        raise RevisionError(
            reasons.CORRUPT, f"{where}: cannot read: {exc.strerror or exc}"
        ) from None
    # Editors on some systems prefix a byte order mark; a stored body never has one.
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        doc = _load_toml(raw) if _is_toml(where, raw) else decode_body(raw)
        body = encode_document(doc)
        # The stored body must decode on every replica by the very rules it
        # will meet there; cheap insurance against an encode/decode asymmetry.
        decode_body(body)
    except RevisionError as exc:
        raise RevisionError(exc.reason, f"{where}: {exc.detail}") from None
    except (RecursionError, ValueError, UnicodeError) as exc:
        # The safety net for hostile input the parsers above let through.
        raise RevisionError(
            reasons.VALIDATION, f"{where}: $: cannot be processed: {exc}"
        ) from None
    return doc.schema_version, body


def _is_toml(name: str, raw: bytes) -> bool:
    suffix = Path(name).suffix.lower()
    if suffix in (".toml", ".json"):
        return suffix == ".toml"
    return not raw.lstrip().startswith(b"{")


def _load_toml(raw: bytes) -> RevisionDocument:
    try:
        tables = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RevisionError(
            reasons.CORRUPT, f"not UTF-8: {exc.reason} at byte {exc.start}"
        ) from None
    # A syntax error is the author's to fix (validation, at $), not damage (corrupt).
    except tomllib.TOMLDecodeError as exc:
        raise RevisionError(reasons.VALIDATION, f"$: not TOML: {exc}") from None
    except RecursionError:
        raise RevisionError(
            reasons.VALIDATION, "$: not TOML here: arrays or inline tables nested too deeply"
        ) from None
    except ValueError:
        # tomllib's int() of an integer past sys.get_int_max_str_digits() digits.
        text = raw.decode("utf-8")
        found = re.search(f"[0-9_]{{{_MAX_INT_DIGITS},}}", text)
        line = text.count("\n", 0, found.start()) + 1 if found else None
        raise RevisionError(
            reasons.VALIDATION,
            f"$: not TOML here: an integer{f' at line {line}' if line else ''} has more than "
            f"{_MAX_INT_DIGITS} digits",
        ) from None
    return document_from_object(tables)


_MAX_INT_DIGITS: Final = 4300  # CPython's default int max str digits
