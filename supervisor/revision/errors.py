"""Why a revision document was refused: one exception, labelled by reason.

Contract (docs/reasons.md): every refusal of a revision document,
whether it happens while decoding a stored body, while compiling it, or while
``publish`` validates a file, is a :class:`RevisionError` whose ``reason`` is
one of the labels catalogued in :mod:`supervisor.reasons`:

- ``corrupt``: not UTF-8, not JSON, or not a JSON object;
- ``incompatible``: ``schema_version`` newer than this build reads;
- ``validation``: a shape or constraint error; ``detail`` starts with the ``$.path``;
- ``projection``: a key names an alias the document does not define;
- ``secret``: a secret reference cannot be resolved;
- ``snapshot``: the snapshot cannot be built (two keys share one secret).

``detail`` is human text for logs, ``/status`` and the CLI. It never contains a
secret value: secret refusals name the key's ``$.path`` and the reference
(``env:NAME``, ``file:/path``), which are not secret.

::

    SupervisorError
    └── LabelledError            (supervisor.errors): .reason, .revision, .detail
        └── RevisionError(reason, detail, revision=None)
"""

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
    """A revision document was refused; ``reason`` says at which stage, ``detail`` why."""

    def __init__(self, reason: str, detail: str, *, revision: int | None = None) -> None:
        if reason not in _KNOWN_REASONS:
            raise ValueError(f"uncatalogued revision reason {reason!r}")
        which = "revision" if revision is None else f"revision {revision}"
        super().__init__(f"{which} refused ({reason}): {detail}", reason=reason, detail=detail,
                         revision=revision)

    def with_revision(self, revision: int | None) -> RevisionError:
        """The same refusal attributed to ``revision`` (self when it already is)."""
        if revision == self.revision:
            return self
        return RevisionError(self.reason, self.detail, revision=revision)

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only ``revision`` would otherwise be lost by pickling (the
        # default reduce replays ``args``, which holds the formatted message).
        return (partial(RevisionError, revision=self.revision), (self.reason, self.detail))
