"""Liveness: when the process is unhealthy, and why (``/healthz``, ``WATCHDOG=1``).

Two readers, one rule set, so they never disagree about the same moment. Operators:
docs/operations.md, "Signals and boot" and "systemd".
"""

from __future__ import annotations

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.revisions import attempt_deadline_s
from supervisor.convergence.side_sinks import SinkStatus
from supervisor.convergence.status import RevisionStatus
from supervisor.threads import FILE_IO_DEADLINE_S
from supervisor.tree import Supervisor

__all__ = ["BOOT_FILE_CALLS", "FOLLOWER_BOOT_FILE_CALLS", "boot_deadline_s", "stall_limit_s",
           "status_line", "unhealthy", "watchdog_healthy"]


def stall_limit_s(cp: ControlPlaneConfig) -> float:
    """How long the loop may go without finishing an attempt (docs/admin-api.md), and
    how long a *restarted* child may spend ``starting`` before it counts as down.

    ``3 * poll_interval_s + backoff_max_s`` (the waits between attempts, with room).
    Plus what one attempt may take on the store's own deadlines, which is no stall:
    a database's observe, size and hydrate
    (:func:`~supervisor.controlplane.revisions.attempt_deadline_s`; 160 s in all with
    the defaults), or a follower's ``fetch_timeout_s``.

    A restarted child's attempts add up until it runs again
    (:meth:`Supervisor.stuck_starting`): a start that hangs, times out and restarts
    is down all along. Every restart reports started within moments (convergence
    skips the boot while a snapshot serves; the others report before connecting).
    So past this limit it is a hang: one number for the operator. First starts are
    exempt: convergence's is the boot, which readiness covers, not liveness.
    """
    return 3 * cp.poll_interval_s + cp.backoff_max_s + _attempt_s(cp)


#: The file calls a start may make before READY, each within FILE_IO_DEADLINE_S: the
#: cache lock, the cache's read or export, a newer cache's removal, the snapshot file.
BOOT_FILE_CALLS = 4
#: A follower's more: its accepted statement's read and restore, the root's bytes written.
FOLLOWER_BOOT_FILE_CALLS = 3


def boot_deadline_s(cp: ControlPlaneConfig) -> float:
    """How long a start may take to READY on its own deadlines.

    One attempt on the store's deadlines and the file calls around it
    (:data:`BOOT_FILE_CALLS`; 355 s with the defaults). The daemon extends
    systemd's start timeout to it (``EXTEND_TIMEOUT_USEC``) as it starts, so
    ``TimeoutStartSec`` cannot kill a start that keeps within its deadlines.
    """
    calls = BOOT_FILE_CALLS + (FOLLOWER_BOOT_FILE_CALLS if cp.backend == "follower" else 0)
    return _attempt_s(cp) + calls * FILE_IO_DEADLINE_S


def _attempt_s(cp: ControlPlaneConfig) -> float:
    return cp.fetch_timeout_s if cp.backend == "follower" else attempt_deadline_s(cp)


def unhealthy(tree: Supervisor | None, status: RevisionStatus, cp: ControlPlaneConfig, *,
              ready: bool, sinks: SinkStatus | None = None) -> list[str]:
    """Why /healthz answers 503 (empty: 200): what the tree cannot help, a restart might.

    A child in ``backoff`` or ``failed``; a restarted child stuck ``starting``; a loop
    with no attempt finished, for :func:`stall_limit_s`. The stall counts only once
    the daemon is ready: before, the boot is readiness's business. Also while the last
    snapshot file write failed: its consumers read a file the daemon cannot replace.
    That one is /healthz only: a restart would not help, so the watchdog is fed.
    """
    found: list[str] = []
    if tree is not None:
        for name, child in tree.children.items():
            if child.state in ("backoff", "failed"):
                found.append(f"child {name} is {child.state}: {child.last_error}")
        limit = stall_limit_s(cp)
        for name, for_s in tree.stuck_starting(limit).items():
            found.append(f"child {name} has been starting for {for_s:.1f} s "
                         f"(limit {limit:g} s)")
    snapshot_error = None if sinks is None else sinks.error("snapshot_file")
    if snapshot_error is not None:
        # Its consumers read a file the daemon cannot replace: a stale or forged one.
        found.append(f"the snapshot file cannot be written: {snapshot_error}")
    stalled = status.stalled_for()
    if ready and stalled > stall_limit_s(cp):
        found.append(f"convergence has not finished an attempt for {stalled:.0f} s "
                     f"(limit {stall_limit_s(cp):g} s)")
    return found


def watchdog_healthy(tree: Supervisor | None, status: RevisionStatus,
                     cp: ControlPlaneConfig) -> bool:
    """Pings stop when the tree cannot help: a crash loop, a failed or stuck child, a stall.

    They go on while a child merely waits for its next restart: the tree handles that.
    """
    if tree is None or tree.crash_looping or tree.stuck_starting(stall_limit_s(cp)):
        return False
    if any(child.state == "failed" for child in tree.children.values()):
        return False
    return status.stalled_for() <= stall_limit_s(cp)


def status_line(healthy: bool, reasons: list[str], active: int | None) -> str:
    """The systemd STATUS= text when the watchdog's answer changes."""
    if not healthy:
        return "unhealthy: " + ("; ".join(reasons) or "children crash looping")
    return "healthy again" + (f"; serving revision {active}" if active is not None else "")
