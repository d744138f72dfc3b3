"""The ``/status`` document, declared once as msgspec Structs.

A bottom module (it imports nothing of ours). Every owner returns its part as declared here;
the event bus carries them. docs/admin-api.md documents exactly these fields
(tests/unit/test_docsgen_pages.py holds its prose to them).
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "ChildReport",
    "ChildReportState",
    "ChildStateName",
    "ChildSubstate",
    "FanoutReport",
    "FanoutState",
    "HookReport",
    "LeadershipReport",
    "Rejection",
    "RevisionReport",
    "Role",
    "SinkState",
    "SinksReport",
    "StatementReport",
    "StatusDocument",
]

ChildStateName = Literal["starting", "running", "backoff", "stopped", "failed"]
#: What a running child may say of itself instead of ``running`` (the LISTEN
#: child retrying its connection).
ChildSubstate = Literal["reconnecting"]
#: What ``children.<name>.state`` reads: the tree's state or the child's own word.
ChildReportState = Literal[ChildStateName, ChildSubstate]
FanoutState = Literal["disabled", "preflight", "watching"]
Role = Literal["leader", "standby", "disabled"]
#: reasons.SINK_STATES, typed.
SinkState = Literal["ok", "failing", "disabled"]


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
    statement_age_s: float | None = None
    upstream: str | msgspec.UnsetType = msgspec.UNSET


class ChildReport(_Part):
    state: ChildReportState
    restarts: int
    last_error: str | None


class FanoutReport(_Part):
    state: FanoutState
    last_error_class: str | None
    objects: int
    skewed: list[str] | msgspec.UnsetType = msgspec.UNSET


class LeadershipReport(_Part):
    """The fan-out leader election (``disabled``: holder and lease null)."""

    role: Role
    holder: str | None
    lease: str | None


class HookReport(_Part):
    """The reload hook (None without one): ``failing`` from a failed run until a run
    succeeds; its last finished run.

    ``outcome`` is ``ok``, ``failed`` (a non-zero exit or a signal), ``timeout``
    (its process group killed) or ``error`` (it could not be started).
    """

    state: SinkState = "ok"
    running: bool = False
    revision: int | None = None
    sequence: int | None = None
    outcome: str | None = None
    exit_code: int | None = None
    duration_s: float | None = None
    output: str | None = None
    finished_at: str | None = None


class SinksReport(_Part):
    """The side sinks: ``failing`` from a refused write until a write succeeds.

    ``<sink>_error``: why its last write was refused, while it is failing.
    """

    cache: SinkState
    snapshot_file: SinkState
    cache_error: str | None
    snapshot_file_error: str | None
    hook: HookReport | None = None


class StatusDocument(_Part):
    """The outward contract of ``GET /status``, and of the stream's first message.

    Each part is its owner's report: the convergence loop's :class:`RevisionReport`, the
    tree's :class:`ChildReport`, the fan-out's :class:`FanoutReport` and
    :class:`LeadershipReport`, the sinks' :class:`SinksReport`. ``AdminContext.status``
    assembles it and encodes it once. A client may decode it with these very Structs.
    """
    revision: RevisionReport
    children: dict[str, ChildReport]
    fanout: dict[str, FanoutReport]
    leadership: LeadershipReport
    sinks: SinksReport
    version: str
    started_at: str
    # Per dependency (database, files, reload, kube, cpu): worker threads still
    # running after their caller's deadline (a stuck call); empty when none.
    threads_past_deadline: dict[str, int] = msgspec.field(default_factory=dict)
