"""The bytes ``GET /v1/revision`` serves: the active revision as the cache signed it.

The same bytes ``[cache]`` writes, in the signed last-known-good file format (docs/admin-api.md).
:class:`SignedRevisionFile` reads and checks them; :func:`etag_for` and :func:`not_modified`
answer conditional requests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from supervisor.admin.responses import entity_tags, etag_matches
from supervisor.sinks.lkg.fileformat import (
    MAGIC,
    MAX_HEADER_BYTES,
    SIGNATURE_BYTES,
    Header,
    peek_header,
)
from supervisor.sinks.lkg.files import NotRegularFile, read_regular
from supervisor.sinks.lkg.statement import Statement

__all__ = ["SignedRevisionFile", "Unservable", "etag_for", "not_modified"]

_STATEMENT_ETAG: Final = re.compile(r'"([0-9]{1,20})\.([0-9a-f]{32})\.(-?[0-9]{1,20})"')


def etag_for(revision: int, body_sha256: bytes | None, statement: Statement | None) -> str:
    """The ETag of ``GET /v1/revision``: the statement's; without one, id and digest.

    The statement's is sequence, body digest and ``issued_at``. So a revision id reused
    for another body, or a fresh statement about the same revision, never answers 304.
    """
    if statement is not None:
        return statement.etag()
    digest = body_sha256.hex()[:32] if body_sha256 is not None else "-"
    return f'"{revision}.{digest}"'

def not_modified(if_none_match: str | None, etag: str, statement: Statement | None) -> bool:
    """Whether ``If-None-Match`` lets ``GET /v1/revision`` answer 304.

    It does when it names ``etag``, or the same sequence and digest issued no earlier.
    Several roots on one control plane behind one address sign the same intent.
    A follower holding a sibling root's statement of it gains nothing from this body.
    """
    if if_none_match is None:
        return False
    if etag_matches(if_none_match, etag):
        return True
    if statement is None:
        return False
    ours = statement.etag()[1:-1].split(".")
    tags = (_STATEMENT_ETAG.fullmatch(tag) for tag in entity_tags(if_none_match))
    return any(m[1] == ours[0] and m[2] == ours[1] and int(m[3]) >= int(ours[2])
               for m in tags if m is not None)


_FRAMING = len(MAGIC) + 4 + MAX_HEADER_BYTES + SIGNATURE_BYTES


class Unservable(Exception):
    """Why the active revision's signed bytes cannot be served now (503 with this detail)."""


@dataclass
class SignedRevisionFile:
    """The cache file behind ``/v1/revision``; ``path`` None or no signing key: never servable.

    The loop exports a revision to the cache before it swaps the snapshot in.
    So once revision N is active the file normally holds N, signed with ``[cache].signing_key``.
    A follower serves the upstream's signed bytes it forwards instead
    (``<[cache].path>.upstream``, :mod:`supervisor.controlplane.follower`), under the same rule.
    The last bytes served are kept under their ETag: a fleet polling costs no file read.
    A conditional request naming that ETag is answered 304 before this class runs.
    """

    path: str | None
    signing: bool
    max_bytes: int = 16 * 1024 * 1024
    _held: tuple[str, bytes] | None = None

    def unservable_reason(self) -> str | None:
        if self.path is None or not self.signing:
            return ("this replica cannot serve signed revisions: it needs [cache].path and "
                    "[cache].signing_key (a follower: [cache].path)")
        return None

    def held(self, etag: str) -> bytes | None:
        """The bytes already read under this ETag, or None (no I/O)."""
        held = self._held
        return held[1] if held is not None and held[0] == etag else None

    def read(self, revision: int, body_sha256: bytes | None,
             statement: Statement | None = None) -> bytes:
        """The file's bytes when they are this revision's (and statement's); Unservable else.

        Its header must name ``revision`` and the active body's SHA-256, and, when one
        serves, the statement's sequence and ``issued_at``. Otherwise (a failed export,
        or the next one under way) the route answers 503 and the follower retries.
        Blocking (file I/O): call it from a worker thread.
        """
        reason = self.unservable_reason()
        if reason is not None:
            raise Unservable(reason)
        assert self.path is not None
        try:
            data = read_regular(self.path, limit=self.max_bytes + _FRAMING + 1)
        except (OSError, NotRegularFile) as exc:
            raise Unservable(f"the cache file cannot be read: {exc}") from exc
        if data is None:
            raise Unservable("the active revision has not been written to the cache yet")
        header = peek_header(data, Header)
        if header is None or header.revision != revision or (
            body_sha256 is not None and header.body_sha256 != body_sha256.hex()
        ):
            raise Unservable(f"the cache does not hold the active revision {revision} (yet)")
        if statement is not None and (header.sequence, header.issued_at) != (
                statement.sequence, statement.issued_at):
            raise Unservable(f"the cache does not hold the active statement (sequence "
                             f"{statement.sequence}) of revision {revision} (yet)")
        if len(data) > self.max_bytes + _FRAMING:
            raise Unservable("the cache file is larger than any revision can be")
        self._held = (etag_for(revision, body_sha256, statement), data)
        return data
