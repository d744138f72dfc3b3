"""Why a revision document was refused: :class:`RevisionError`, labelled by reason."""

from __future__ import annotations

from functools import partial

from supervisor import reasons
from supervisor.errors import LabelledError

__all__ = ["RevisionError"]

# Any catalogued revision reason is accepted (the control-plane and cache
# modules may report a refused body with their own labels); anything else is a
# programming error caught at the raise site instead of reaching a metric.
_KNOWN_REASONS: frozenset[str] = frozenset(reasons.REVISION_REASONS)


class RevisionError(LabelledError):
    """A revision document was refused; ``reason`` says at which stage, ``detail`` why.

    Every refusal is one: decoding a stored body, compiling it, ``publish`` validating a file.
    ``reason`` is a label of :mod:`supervisor.reasons` (docs/reasons.md says each one's meaning).
    A ``validation`` detail starts with the ``$.path``. ``detail`` is human text for logs,
    ``/status`` and the CLI. It never holds a secret value: a ``secret`` refusal names the
    key's ``$.path`` and the reference (``env:NAME``, ``file:/path``), which are not secret.
    """

    def __init__(self, reason: str, detail: str, *, revision: int | None = None) -> None:
        if reason not in _KNOWN_REASONS:
            raise ValueError(f"uncatalogued revision reason {reason!r}")
        which = "revision" if revision is None else f"revision {revision}"
        super().__init__(f"{which} refused ({reason}): {detail}", reason=reason, detail=detail,
                         revision=revision)

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only ``revision`` would otherwise be lost by pickling (the
        # default reduce replays ``args``, which holds the formatted message).
        return (partial(RevisionError, revision=self.revision), (self.reason, self.detail))
