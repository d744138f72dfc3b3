"""The ``/status`` document, declared once as msgspec Structs.

:class:`StatusDocument` is the outward contract of ``GET /status`` (and of the
stream's first message): :meth:`AdminContext.status` assembles it from the
reports of the convergence loop, the supervision tree and the fan-out, and
serves its JSON form. ``docs/admin-api.md`` documents exactly these fields
(``tests/unit/test_docsgen_pages.py`` holds the catalogue's prose to them), and
a client may decode the document with these very Structs.

A report that does not fit its Struct is a bug of this build, not of the data:
it is logged and the undeclared document served as it is, so ``/status`` never
fails over its own shape.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from supervisor.logs import get_logger
from supervisor.tree import ChildStateName

__all__ = ["ChildReport", "FanoutReport", "LeadershipReport", "Rejection", "RevisionReport",
           "SinksReport", "StatusDocument", "declared"]

log = get_logger("admin")


class _Part(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class Rejection(_Part):
    revision: int | None
    reason: str
    detail: str
    at: str


class StatementReport(_Part):
    sequence: int
    root: str
    issued_at: str
    expires_at: str
    age_s: float
    stale: bool


class RevisionReport(_Part):
    desired: int | None
    loaded: int | None
    active: int | None
    generation: int
    source: str | None
    lag_s: float
    last_convergence_s: float | None
    consecutive_failures: int
    last_rejection: Rejection | None
    control_plane_up: bool | None
    last_error: str | None
    sequence: int | None
    statement: StatementReport | None
    upstream: str | msgspec.UnsetType = msgspec.UNSET


class ChildReport(_Part):
    state: ChildStateName
    restarts: int
    last_error: str | None


class FanoutReport(_Part):
    state: Literal["disabled", "preflight", "watching"]
    last_error_class: str | None
    objects: int
    skewed: list[str] | msgspec.UnsetType = msgspec.UNSET


class LeadershipReport(_Part):
    """Issue 14: the fan-out leader election (``disabled``: holder and lease null)."""

    role: Literal["leader", "standby", "disabled"]
    holder: str | None
    lease: str | None


SinkStateName = Literal["ok", "failing", "disabled"]


class SinksReport(_Part):
    """The side sinks: ``failing`` from a refused write until a write succeeds.

    ``<sink>_error``: why its last write was refused, while it is failing.
    """

    cache: SinkStateName
    snapshot_file: SinkStateName
    cache_error: str | None
    snapshot_file_error: str | None


class StatusDocument(_Part):
    revision: RevisionReport
    children: dict[str, ChildReport]
    fanout: dict[str, FanoutReport]
    leadership: LeadershipReport
    sinks: SinksReport
    version: str
    started_at: str


def declared(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` checked against :class:`StatusDocument` (logged, never raised, if not)."""
    try:
        msgspec.convert(document, StatusDocument)
    except msgspec.ValidationError as exc:
        log.error("the /status document does not match its declaration (a bug of this "
                  "build); serving it as it is", error=str(exc))
    return document
