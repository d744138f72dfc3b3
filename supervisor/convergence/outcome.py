"""What one convergence attempt came to (:class:`Outcome`), and how a failure is classified.

The classification lives here so the loop, the bootstrap and the reporting agree on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from supervisor import reasons
from supervisor.controlplane.errors import (
    ControlPlaneError,
    FailureCategory,
    Incompatible,
    TooLarge,
)
from supervisor.convergence.signal import ConvergeAnswer, OutcomeLabel
from supervisor.errors import LabelledError
from supervisor.revision.errors import RevisionError

__all__ = [
    "UNREACHED", "Key", "Outcome", "OutcomeKind", "answer_for",
    "is_final",
]

# The control plane could not be asked: back off (the Schedule's backoff).
UNREACHED = frozenset({reasons.UNAVAILABLE, reasons.CONFLICT})

# Compile refusals that only a new body can change (``secret`` is not here:
# the secret may appear; ``unavailable`` is a transient OS error).
# ``snapshot`` (two keys share one secret) depends on the secrets' values, not
# only the body: a rotated secret file can clear it, so it is retried too.
_FINAL_COMPILE = frozenset({
    reasons.CORRUPT, reasons.INCOMPATIBLE, reasons.VALIDATION, reasons.PROJECTION,
})

# A revision's identity: its id and its body's SHA-256 (None: not known yet).
Key = tuple[int, bytes | None]


class OutcomeKind(enum.Enum):
    """An attempt's end; its value is the ``POST /v1/converge`` answer's ``outcome``."""

    PUBLISHED = "published"
    CONVERGED = "converged"
    EMPTY = "empty"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Outcome:
    """An attempt's end: published, converged, empty or rejected.

    A rejection carries the reason label, the revision when it is about one, and
    the detail.
    """

    kind: OutcomeKind
    revision: int | None = None
    generation: int | None = None
    reason: str | None = None
    detail: str | None = None
    took_s: float = 0.0
    #: A refusal already reported for this very revision (not hydrated again).
    repeated: bool = False

    @property
    def failed(self) -> bool:
        return self.kind is OutcomeKind.REJECTED


def is_final(exc: LabelledError) -> bool:
    """True when the refusal cannot change while the revision's content does not.

    The loop then does not hydrate that revision again until desired moves, or SIGHUP
    asks to look again (:meth:`~supervisor.convergence.status.RevisionStatus.forget_refusal`).
    """
    if isinstance(exc, RevisionError):
        return exc.reason in _FINAL_COMPILE
    if isinstance(exc, TooLarge | Incompatible):
        return True
    return (isinstance(exc, ControlPlaneError) and exc.category is FailureCategory.CORRUPT
            and exc.revision is not None)


def answer_for(outcome: Outcome | None) -> ConvergeAnswer:
    """The ``POST /v1/converge`` answer for an attempt (None: it was interrupted).

    A refusal about a revision is ``rejected``; a refusal with no revision
    (the control plane unreachable, or refusing the read) is ``failed``.
    """
    if outcome is None:
        return ConvergeAnswer("failed")
    if outcome.kind is OutcomeKind.REJECTED and outcome.revision is None:
        return ConvergeAnswer("failed", None, outcome.reason)
    label: OutcomeLabel = outcome.kind.value
    return ConvergeAnswer(label, outcome.revision, outcome.reason)
